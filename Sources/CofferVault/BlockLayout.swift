// BlockLayout is the one place where plaintext and ciphertext offsets and sizes are
// converted: header, then 4136-byte ciphertext blocks for 4096-byte plaintext blocks.
// Two layouts (docs/FORMAT.md §4): up to format 3, an 18-byte header and a last block of
// 1…4096 bytes (an empty file is an empty backing file); from format 4, a 34-byte header
// (with the place tag) and a final block of n mod 4096 bytes — 0 included — so that a
// file cut anywhere, block boundaries too, no longer ends in a block that opens.
import CofferCrypto
import CofferSystem
import Glibc

public struct BlockLayout: Sendable, Equatable {
    /// Plaintext bytes per block.
    public static let plainBlockSize = Int64(ContentCipher.blockSize)
    /// Ciphertext bytes per full block (nonce 24 + data 4096 + tag 16).
    public static let cipherBlockSize = Int64(ContentCipher.cipherBlockSize)
    /// Bytes each block grows by.
    public static let overhead = Int64(ContentCipher.overhead)

    /// Formats 1–3: header version 1, no final block.
    public static let unbound = BlockLayout(header: 1)
    /// Format 4: header version 2 (with the place tag), every file ends in a final block.
    public static let bound = BlockLayout(header: 2)
    /// Format 6: as format 4, and files made while locked have header version 3.
    public static let boundWithDrops = BlockLayout(header: 2, sealed: true)

    /// Format 8: header version 4, each file's key wrapped in it (a file made while locked
    /// has a wrap of zeros and its key in its key record).
    public static let wrapped = BlockLayout(header: FileHeader.wrappedVersion)

    /// The layout of a vault of `format`.
    public static func of(format: Int) -> BlockLayout {
        format >= 8 ? .wrapped : format >= 6 ? .boundWithDrops : format >= 4 ? .bound : .unbound
    }

    /// The header version this layout writes and reads.
    public let headerVersion: UInt16
    /// Header version 3 (a file made while locked, FileHeader.sealedVersion) is read too.
    public let readsSealedHeaders: Bool
    /// Bytes of the file header before block 0.
    public let headerSize: Int64
    /// Every file ends in a sealed final block of n mod 4096 plaintext bytes (format 4).
    public var endsInFinalBlock: Bool { headerVersion >= 2 }

    private init(header version: UInt16, sealed: Bool = false) {
        headerVersion = version
        readsSealedHeaders = sealed
        headerSize = Int64(FileHeader.size(version: version))
    }

    /// Largest plaintext size (and write end) coffer accepts: 2^62 bytes, so that no
    /// ciphertext offset can overflow Int64. The backing file system's own limit
    /// (16 TiB on ext4) is lower and answers EFBIG first.
    public static let maxPlainSize: Int64 = 1 << 62

    /// Throws EFBIG unless a file may reach `end` plaintext bytes.
    public static func checkSize(_ end: Int64) throws {
        guard end >= 0, end <= maxPlainSize else { throw Errno(EFBIG, "file size") }
    }

    /// Index of the block holding plaintext offset `offset`.
    public static func blockIndex(plainOffset offset: Int64) -> Int64 { offset / plainBlockSize }

    /// Ciphertext offset at which block `index` starts.
    public func cipherOffset(block index: Int64) -> Int64 { headerSize + index * Self.cipherBlockSize }

    /// Plaintext size of the whole blocks of a damaged file whose length cuts a block.
    public func plainSizeOfWholeBlocks(cipherSize: Int64) -> Int64 {
        max(0, (cipherSize - headerSize) / Self.cipherBlockSize * Self.plainBlockSize)
    }

    /// Plaintext size of a ciphertext file of `cipherSize` bytes. Up to format 3 an empty
    /// file is empty; a size that ends inside a header, nonce or tag is a truncated file
    /// (from format 4, so is a size without a final block: an empty backing file, or one
    /// that ends at a block boundary).
    public func plainSize(cipherSize: Int64) throws -> Int64 {
        if cipherSize == 0 && !endsInFinalBlock { return 0 }
        guard cipherSize >= headerSize else { throw VaultError.fileTruncated(cipherSize: cipherSize) }
        let body = cipherSize - headerSize
        let full = body / Self.cipherBlockSize, rest = body % Self.cipherBlockSize
        if rest == 0 && !endsInFinalBlock { return full * Self.plainBlockSize }
        guard endsInFinalBlock ? rest >= Self.overhead : rest > Self.overhead else {
            throw VaultError.fileTruncated(cipherSize: cipherSize)
        }
        return full * Self.plainBlockSize + rest - Self.overhead
    }

    /// Ciphertext size of a file holding `plainSize` plaintext bytes (up to format 3, 0
    /// stays 0).
    public func cipherSize(plainSize: Int64) -> Int64 {
        let full = plainSize / Self.plainBlockSize, rest = plainSize % Self.plainBlockSize
        if endsInFinalBlock { return headerSize + full * Self.cipherBlockSize + rest + Self.overhead }
        if plainSize == 0 { return 0 }
        return headerSize + full * Self.cipherBlockSize + (rest > 0 ? rest + Self.overhead : 0)
    }

    /// What `count` ciphertext bytes read from the start of a block open to: their
    /// plaintext bytes, and whether they end inside a block's nonce or tag (a cut; the
    /// whole blocks before it still open).
    public func plainBytes(inCipherBytes count: Int) -> (plain: Int, endsInOverhead: Bool) {
        let full = Int64(count) / Self.cipherBlockSize, rest = Int64(count) % Self.cipherBlockSize
        // From format 4 a final block of no bytes is nonce ‖ tag alone.
        let cut = rest > 0 && (endsInFinalBlock ? rest < Self.overhead : rest <= Self.overhead)
        return (Int(full * Self.plainBlockSize + max(0, rest - Self.overhead)), cut)
    }

    /// Block slots in a backing file of `cipherSize` bytes: the whole ones, and with
    /// `partial` a partial last one too.
    public func slots(cipherSize: Int64, countingPartial partial: Bool) -> Int64 {
        let body = max(0, cipherSize - headerSize)
        return (partial ? body + Self.cipherBlockSize - 1 : body) / Self.cipherBlockSize
    }

    /// `length` plaintext bytes from a block's start, rounded up to whole blocks.
    public static func wholeBlocks(plainLength length: Int) -> Int {
        let block = Int(plainBlockSize)
        return (length + block - 1) / block * block
    }

    /// Plaintext length of block `index` in a file of `plainSize` bytes (0 past the end,
    /// and for a final block that holds no byte).
    public static func blockLength(_ index: Int64, plainSize: Int64) -> Int {
        Int(max(0, min(plainBlockSize, plainSize - index * plainBlockSize)))
    }

    /// Index of the final block of a file of `plainSize` bytes (format 4).
    public static func finalBlock(plainSize: Int64) -> Int64 { plainSize / plainBlockSize }
}
