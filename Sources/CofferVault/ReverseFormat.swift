// ReverseFormat computes what a reverse view shows (docs/FORMAT.md §14): the format-7
// vault of a plaintext directory, every random choice of §1–§8 made a function of K_rev
// instead — IV files, names, file headers, content, symlink targets — read from the
// plaintext on demand. It knows no node or mount: bytes and descriptors in, bytes out.
import CofferCrypto
import CofferSystem
import Glibc

public struct ReverseFormat: Sendable {
    /// The view's config in PLAINDIR, served as the view's `coffer.conf`.
    public static let configName = ".coffer.reverse.conf"
    /// The format a view is (§14: a reverse view is a format-7 vault).
    public static let format = 7
    /// Block layout of the view's files.
    public static let layout = BlockLayout.of(format: format)
    /// Longest symlink target a view serves: one that fits the backing symlink (§7).
    public static let maxTargetLength = SymlinkCodec.maxInlineTargetLength

    public let keys: KeySet
    public let reverse: ReverseKey
    private let names: NameTransform
    private let symlinks: SymlinkCodec

    /// The view's keys from the master key of its config (`config` of format 7).
    public init(master: MasterKey, config: VaultConfig) {
        keys = KeySet(master: master, content: config.contentAlgorithm, perFileKeys: true, drops: false)
        reverse = ReverseKey(master: master)
        names = NameTransform(cipher: keys.names)
        symlinks = SymlinkCodec(box: keys.metadata)
    }

    /// Zeroes every key.
    public func wipe() {
        keys.wipe()
        reverse.wipe()
    }

    /// The IV file of a directory with IV `iv` whose entry is `name` in the directory with
    /// IV `parentIV` (both empty for the root): IV ‖ its place's tag ‖ 16 zero bytes.
    public func ivFile(iv: [UInt8], parentIV: [UInt8], name: [UInt8]) throws -> [UInt8] {
        iv + (try keys.places.directoryTag(iv: iv, parentIV: parentIV, name: name)) + [UInt8](repeating: 0, count: PlaceMAC.tagSize)
    }

    /// The backing name of `name` in the directory with IV `dirIV`.
    public func backingName(_ name: [UInt8], dirIV: [UInt8]) throws -> BackingName {
        try names.backingName(for: name, dirIV: dirIV)
    }

    /// The plaintext name of short backing name `stored` in the directory with IV
    /// `dirIV`, or nil if it is none.
    public func plaintextName(ofShort stored: String, dirIV: [UInt8]) -> [UInt8]? {
        guard let encrypted = try? Base64URL.decode(stored) else { return nil }
        return try? keys.names.decrypt(encrypted, dirIV: dirIV)
    }

    /// The ID of an entry: its place's with one link, its inode's with more.
    public func entryID(dirIV: [UInt8], name: [UInt8], links: UInt64, inode: UInt64) throws -> FileID {
        links > 1 ? try reverse.linkedEntryID(inode: inode) : try reverse.entryID(dirIV: dirIV, name: name)
    }

    /// The header of a file of entry `id`: version 2, the ID, the place tag of `name` in
    /// the directory with IV `dirIV` (one link) or the linked tag (more).
    public func header(id: FileID, dirIV: [UInt8], name: [UInt8], links: UInt64) throws -> [UInt8] {
        let tag = links > 1 ? try keys.places.linkedTag(fileID: id.bytes)
            : try keys.places.tag(fileID: id.bytes, dirIV: dirIV, name: name)
        return [0, UInt8(Self.layout.headerVersion)] + id.bytes + tag
    }

    /// The backing symlink target of `target` for entry `id`, or nil for a target too long
    /// for a backing symlink (left out of the view).
    public func symlinkTarget(_ target: [UInt8], id: FileID) throws -> String? {
        guard target.count <= Self.maxTargetLength else { return nil }
        return try symlinks.encrypt(target, nonce: reverse.symlinkNonce(entryID: id, target: target)).linkTarget
    }

    /// Size of the view's file of a plaintext file of `plainSize` bytes.
    public static func cipherSize(plainSize: Int64) -> Int64 { layout.cipherSize(plainSize: plainSize) }

    /// Size of the view's symlink of a target of `length` bytes.
    public static func symlinkSize(targetLength length: Int) -> Int64 {
        Int64((4 * (length + SealedBox.overhead) + 2) / 3)
    }

    /// A file of the view, as open: the plaintext file, its size when opened, its header.
    public struct OpenFile: Sendable {
        public let plain: Int32
        public let plainSize: Int64
        public let id: FileID
        public let header: [UInt8]

        public init(plain: Int32, plainSize: Int64, id: FileID, header: [UInt8]) {
            (self.plain, self.plainSize, self.id, self.header) = (plain, plainSize, id, header)
        }

        public var cipherSize: Int64 { ReverseFormat.cipherSize(plainSize: plainSize) }
    }

    /// Reads the view's bytes of `file` from `offset` into `out`: the header, then the
    /// blocks of the plaintext, each read and sealed for the request. Returns the count (0
    /// at the end). A plaintext file that got shorter since it was opened is an I/O error:
    /// its blocks no longer make the file the size said.
    public func read(_ file: OpenFile, at offset: Int64, into out: UnsafeMutableRawBufferPointer) throws -> Int {
        let size = file.cipherSize
        guard offset < size else { return 0 }
        let end = min(size, offset + Int64(out.count))
        var done = 0
        let headerSize = Self.layout.headerSize
        if offset < headerSize {
            let n = Int(min(headerSize, end) - offset)
            file.header.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress! + Int(offset), byteCount: n) }
            done = n
        }
        guard offset + Int64(done) < end else { return done }
        let blockSize = BlockLayout.cipherBlockSize, plainBlock = BlockLayout.plainBlockSize
        let first = (offset + Int64(done) - headerSize) / blockSize
        let last = (end - 1 - headerSize) / blockSize
        let plainStart = first * plainBlock
        let plainCount = Int(min(file.plainSize, (last + 1) * plainBlock) - plainStart)
        let cipherStart = Self.layout.cipherOffset(block: first)
        let cipherCount = Int(min(size, Self.layout.cipherOffset(block: last + 1)) - cipherStart)
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: max(plainCount, 1), alignment: 16)
        let sealed = UnsafeMutableRawBufferPointer.allocate(byteCount: cipherCount, alignment: 16)
        defer {
            // The user's plaintext does not stay in freed memory.
            explicit_bzero(plain.baseAddress!, plain.count)
            plain.deallocate()
            sealed.deallocate()
        }
        let got = try Sys.readFully(file.plain, into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<plainCount]), at: plainStart)
        guard got == plainCount else { throw Errno(EIO, "the plaintext file got shorter while the view read it") }
        // A final block of no bytes (a size that is a multiple of 4096) is sealed on its own.
        let emptyFinal = last == BlockLayout.finalBlock(plainSize: file.plainSize) && file.plainSize % plainBlock == 0
        let runLength = ContentCipher.cipherLength(plainLength: plainCount)
        if plainCount > 0 {
            try keys.content.sealSynthetic(UnsafeRawBufferPointer(rebasing: plain[0..<plainCount]), firstBlock: UInt64(first),
                                           fileID: file.id, reverse: reverse, into: UnsafeMutableRawBufferPointer(rebasing: sealed[0..<runLength]))
        }
        if emptyFinal {
            try keys.content.sealSynthetic(UnsafeRawBufferPointer(rebasing: plain[0..<0]), firstBlock: UInt64(last), fileID: file.id,
                                           reverse: reverse, into: UnsafeMutableRawBufferPointer(rebasing: sealed[runLength...]))
        }
        let skip = Int(offset + Int64(done) - cipherStart)
        let n = Int(end - (offset + Int64(done)))
        (out.baseAddress! + done).copyMemory(from: sealed.baseAddress! + skip, byteCount: n)
        return done + n
    }
}
