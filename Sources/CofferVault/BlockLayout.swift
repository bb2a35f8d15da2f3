// BlockLayout is the one place where plaintext and ciphertext offsets and sizes are
// converted: header, then 4136-byte ciphertext blocks for 4096-byte plaintext blocks.
import CofferCrypto
import CofferSystem
import Glibc

public enum BlockLayout {
    /// Plaintext bytes per block.
    public static let plainBlockSize = Int64(ContentCipher.blockSize)
    /// Ciphertext bytes per full block (nonce 24 + data 4096 + tag 16).
    public static let cipherBlockSize = Int64(ContentCipher.cipherBlockSize)
    /// Bytes each block grows by.
    public static let overhead = Int64(ContentCipher.overhead)
    /// Bytes of the file header before block 0.
    public static let headerSize = Int64(FileHeader.size)

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
    public static func cipherOffset(block index: Int64) -> Int64 { headerSize + index * cipherBlockSize }

    /// Plaintext size of the whole blocks of a damaged file whose length cuts a block.
    public static func plainSizeOfWholeBlocks(cipherSize: Int64) -> Int64 {
        max(0, (cipherSize - headerSize) / cipherBlockSize * plainBlockSize)
    }

    /// Plaintext size of a ciphertext file of `cipherSize` bytes. An empty file is
    /// empty; a size that ends inside a header, nonce or tag is a truncated file.
    public static func plainSize(cipherSize: Int64) throws -> Int64 {
        if cipherSize == 0 { return 0 }
        guard cipherSize >= headerSize else { throw VaultError.fileTruncated(cipherSize: cipherSize) }
        let body = cipherSize - headerSize
        let full = body / cipherBlockSize, rest = body % cipherBlockSize
        if rest == 0 { return full * plainBlockSize }
        guard rest > overhead else { throw VaultError.fileTruncated(cipherSize: cipherSize) }
        return full * plainBlockSize + rest - overhead
    }

    /// Ciphertext size of a file holding `plainSize` plaintext bytes (0 stays 0).
    public static func cipherSize(plainSize: Int64) -> Int64 {
        if plainSize == 0 { return 0 }
        let full = plainSize / plainBlockSize, rest = plainSize % plainBlockSize
        return headerSize + full * cipherBlockSize + (rest > 0 ? rest + overhead : 0)
    }

    /// Plaintext length of block `index` in a file of `plainSize` bytes (0 past the end).
    public static func blockLength(_ index: Int64, plainSize: Int64) -> Int {
        Int(max(0, min(plainBlockSize, plainSize - index * plainBlockSize)))
    }
}
