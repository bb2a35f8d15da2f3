// ContentFile reads and writes plaintext at any offset of one encrypted backing file:
// block read-modify-write, holes, truncation up and down.
//
// Thread safety: writes are read-modify-write of whole blocks and the file ID is cached
// in a FileIDCache shared by every ContentFile of the same backing inode, so callers
// serialise writes and truncates against everything else on that inode (PlainFileSystem
// holds a per-node reader-writer lock); concurrent reads are safe.
import CofferCrypto
import Glibc

/// The file ID of one backing inode, cached once read; shared by all its open files.
public final class FileIDCache: @unchecked Sendable {
    private let lock = Lock()
    private var id: FileID?
    public init() {}

    var fileID: FileID? {
        get { lock.withLock { id } }
        set { lock.withLock { id = newValue } }
    }
}

public struct ContentFile {
    /// The backing file, opened for reading (and writing, for writes).
    public let fd: Int32
    private let cipher: ContentCipher
    private let ids: FileIDCache

    public init(fd: Int32, cipher: ContentCipher, ids: FileIDCache = FileIDCache()) {
        self.fd = fd
        self.cipher = cipher
        self.ids = ids
    }

    /// The plaintext size, from the backing file's size.
    public func plainSize() throws -> Int64 {
        try BlockLayout.plainSize(cipherSize: Int64(Sys.stat(fd).st_size))
    }

    /// The file ID from the header, or nil for an empty file.
    public func fileID() throws -> FileID? {
        if let id = ids.fileID { return id }
        var bytes = [UInt8](repeating: 0, count: FileHeader.size)
        let n = try bytes.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: 0) }
        if n == 0 { return nil }
        let header = try FileHeader(parsing: Array(bytes.prefix(n)))
        ids.fileID = header.fileID
        return header.fileID
    }

    private func createHeader() throws -> FileID {
        let header = FileHeader(fileID: .random())
        try header.bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: 0) }
        ids.fileID = header.fileID
        return header.fileID
    }

    /// The backing file's size, and the plaintext size it means.
    private func sizes() throws -> (cipher: Int64, plain: Int64) {
        let cipher = Int64(try Sys.stat(fd).st_size)
        return (cipher, try BlockLayout.plainSize(cipherSize: cipher))
    }

    // MARK: Reading

    /// Reads up to `buffer.count` plaintext bytes at `offset`; returns how many (0 at EOF).
    /// Throws `blockDamaged` naming the first block in the range that fails authentication.
    /// One pread and no fstat: how much there is follows from how much pread returned.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        guard buffer.count > 0, offset >= 0 else { return 0 }
        let first = BlockLayout.blockIndex(plainOffset: offset)
        let last = BlockLayout.blockIndex(plainOffset: offset + Int64(buffer.count) - 1)
        let cipherStart = BlockLayout.cipherOffset(block: first)
        let scratch = UnsafeMutableRawBufferPointer.allocate(
            byteCount: Int(last - first + 1) * ContentCipher.cipherBlockSize, alignment: 16)
        defer { scratch.deallocate() }
        let n = try Sys.readFully(fd, into: scratch, at: cipherStart)
        // Plaintext bytes in what was read: whole blocks, then a partial last block.
        let full = n / ContentCipher.cipherBlockSize, rest = n % ContentCipher.cipherBlockSize
        let available = full * ContentCipher.blockSize + max(0, rest - ContentCipher.overhead)
        let skip = Int(offset - first * BlockLayout.plainBlockSize)
        let wanted = min(buffer.count, available - skip)
        if rest > 0 && rest <= ContentCipher.overhead && skip + buffer.count > available {
            // Cut inside a block's nonce or tag: the whole blocks before still read.
            throw VaultError.fileTruncated(cipherSize: cipherStart + Int64(n))
        }
        guard wanted > 0, let id = try fileID() else { return 0 }
        // Open only the blocks that hold the wanted bytes.
        let plainLength = min(available, (skip + wanted + ContentCipher.blockSize - 1) / ContentCipher.blockSize * ContentCipher.blockSize)
        let sealed = UnsafeRawBufferPointer(rebasing: scratch[0..<ContentCipher.cipherLength(plainLength: plainLength)])
        if skip == 0 && wanted == plainLength {
            try open(sealed, first: first, fileID: id, into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<wanted]))
        } else {
            let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: plainLength, alignment: 16)
            defer { plain.deallocate() }
            try open(sealed, first: first, fileID: id, into: plain)
            buffer.baseAddress!.copyMemory(from: plain.baseAddress! + skip, byteCount: wanted)
        }
        return wanted
    }

    /// Opens sealed blocks from block `first`, reporting damage as a VaultError.
    private func open(_ sealed: UnsafeRawBufferPointer, first: Int64, fileID id: FileID,
                      into plain: UnsafeMutableRawBufferPointer) throws {
        do {
            try cipher.openInParallel(sealed, firstBlock: UInt64(first), fileID: id, into: plain)
        } catch CryptoError.blockAuthenticationFailed(let index) {
            throw VaultError.blockDamaged(blockIndex: index)
        } catch CryptoError.blockTooShort(let index, _) {
            throw VaultError.blockDamaged(blockIndex: index)
        }
    }

    /// Reads and opens the blocks from `first` holding `plainLength` plaintext bytes.
    private func readBlocks(_ first: Int64, plainLength: Int, fileID id: FileID,
                            into plain: UnsafeMutableRawBufferPointer) throws {
        let cipherLength = ContentCipher.cipherLength(plainLength: plainLength)
        let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: cipherLength, alignment: 16)
        defer { scratch.deallocate() }
        let n = try Sys.readFully(fd, into: scratch, at: BlockLayout.cipherOffset(block: first))
        guard n == cipherLength else {
            throw VaultError.fileTruncated(cipherSize: BlockLayout.cipherOffset(block: first) + Int64(n))
        }
        try open(UnsafeRawBufferPointer(scratch), first: first, fileID: id, into: plain)
    }

    // MARK: Writing

    /// Writes `data` at plaintext `offset`, extending the file (with holes) if needed.
    public func write(_ data: UnsafeRawBufferPointer, at offset: Int64) throws {
        guard data.count > 0 else { return }
        try BlockLayout.checkSize(offset + Int64(data.count))
        let (cipherSize, oldSize) = try sizes()
        let end = offset + Int64(data.count)
        let first = BlockLayout.blockIndex(plainOffset: offset)
        // An empty file gets its header with the first write; when that write starts at
        // block 0, both go to the disk in one pwrite.
        var pendingHeader: FileHeader?
        let id: FileID
        if cipherSize == 0 {
            let header = FileHeader(fileID: .random())
            if first == 0 {
                pendingHeader = header
            } else {
                try header.bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: 0) }
            }
            ids.fileID = header.fileID
            id = header.fileID
        } else {
            guard let known = try fileID() else { throw VaultError.fileTruncated(cipherSize: cipherSize) }
            id = known
        }
        let last = BlockLayout.blockIndex(plainOffset: end - 1)
        let regionStart = first * BlockLayout.plainBlockSize
        let regionEnd = max(end, min(oldSize, (last + 1) * BlockLayout.plainBlockSize))

        // Rewriting the old partial last block while extending the file: reserve the
        // space first, so that ENOSPC cannot strike after that block was overwritten.
        let oldLast = BlockLayout.blockIndex(plainOffset: oldSize)
        if oldSize % BlockLayout.plainBlockSize != 0 && oldLast <= last && end > oldSize {
            let start = BlockLayout.cipherOffset(block: oldLast)
            let length = BlockLayout.cipherSize(plainSize: max(end, (oldLast + 1) * BlockLayout.plainBlockSize)) - start
            do {
                try Sys.fallocate(fd, mode: FALLOC_FL_KEEP_SIZE, offset: start, length: length)
            } catch let error as Errno where error.code == EOPNOTSUPP {
                // The backing file system cannot reserve space; write without the guarantee.
            }
        }
        // An old partial last block before the written region becomes a full block.
        if oldSize % BlockLayout.plainBlockSize != 0 && oldLast < first {
            try resizeBlock(oldLast, from: BlockLayout.blockLength(oldLast, plainSize: oldSize),
                            to: Int(BlockLayout.plainBlockSize), fileID: id)
        }

        if offset == regionStart && end == regionEnd {
            // Whole blocks (or a new tail): seal straight from the caller's buffer.
            return try sealAndWrite(data, firstBlock: first, fileID: id, header: pendingHeader)
        }
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(regionEnd - regionStart), alignment: 16)
        defer { plain.deallocate() }
        plain.initializeMemory(as: UInt8.self, repeating: 0)
        var headRead = false
        if offset > regionStart && regionStart < oldSize {
            let length = BlockLayout.blockLength(first, plainSize: oldSize)
            try readBlocks(first, plainLength: length, fileID: id,
                           into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<length]))
            headRead = true
        }
        if end < regionEnd && !(headRead && first == last) {
            let length = BlockLayout.blockLength(last, plainSize: oldSize)
            let at = Int((last - first) * BlockLayout.plainBlockSize)
            try readBlocks(last, plainLength: length, fileID: id,
                           into: UnsafeMutableRawBufferPointer(rebasing: plain[at..<at + length]))
        }
        (plain.baseAddress! + Int(offset - regionStart)).copyMemory(from: data.baseAddress!, byteCount: data.count)
        try sealAndWrite(UnsafeRawBufferPointer(plain), firstBlock: first, fileID: id, header: pendingHeader)
    }

    /// Seals `plain` as the blocks from `firstBlock` and writes them in one pwrite, after
    /// `header` if one is given (then `firstBlock` is 0).
    private func sealAndWrite(_ plain: UnsafeRawBufferPointer, firstBlock: Int64, fileID id: FileID,
                              header: FileHeader? = nil) throws {
        let prefix = header == nil ? 0 : FileHeader.size
        let sealed = UnsafeMutableRawBufferPointer.allocate(
            byteCount: prefix + ContentCipher.cipherLength(plainLength: plain.count), alignment: 16)
        defer { sealed.deallocate() }
        if let header { header.bytes.withUnsafeBytes { sealed.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: prefix) } }
        try cipher.sealInParallel(plain, firstBlock: UInt64(firstBlock), fileID: id,
                              into: UnsafeMutableRawBufferPointer(rebasing: sealed[prefix...]))
        try Sys.writeFully(fd, UnsafeRawBufferPointer(sealed), at: BlockLayout.cipherOffset(block: firstBlock) - Int64(prefix))
    }

    /// Re-seals block `index` with a new plaintext length (cut, or zero-extended).
    private func resizeBlock(_ index: Int64, from oldLength: Int, to newLength: Int, fileID id: FileID) throws {
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(BlockLayout.plainBlockSize), alignment: 16)
        defer { plain.deallocate() }
        plain.initializeMemory(as: UInt8.self, repeating: 0)
        if oldLength > 0 {
            try readBlocks(index, plainLength: oldLength, fileID: id,
                           into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<oldLength]))
        }
        try sealAndWrite(UnsafeRawBufferPointer(rebasing: plain[0..<newLength]), firstBlock: index, fileID: id)
    }

    /// Sets the plaintext size. Growing leaves holes (no encrypted zeros are written
    /// beyond the old last block); shrinking re-seals the new last block if it is partial.
    public func truncate(to newSize: Int64) throws {
        // Emptying needs no block, so it works on a damaged file too.
        if newSize == 0 {
            try Sys.truncate(fd, to: 0)
            ids.fileID = nil
            return
        }
        try BlockLayout.checkSize(newSize)
        let oldSize = try plainSize()
        guard newSize != oldSize else { return }
        let id = try fileID() ?? createHeader()
        if newSize < oldSize {
            let index = BlockLayout.blockIndex(plainOffset: newSize)
            let keep = Int(newSize % BlockLayout.plainBlockSize)
            if keep != 0 {
                try resizeBlock(index, from: BlockLayout.blockLength(index, plainSize: oldSize), to: keep, fileID: id)
            }
        } else if oldSize % BlockLayout.plainBlockSize != 0 {
            let index = BlockLayout.blockIndex(plainOffset: oldSize)
            let oldLength = BlockLayout.blockLength(index, plainSize: oldSize)
            let newLength = BlockLayout.blockLength(index, plainSize: newSize)
            try resizeBlock(index, from: oldLength, to: newLength, fileID: id)
            do {
                try Sys.truncate(fd, to: BlockLayout.cipherSize(plainSize: newSize))
            } catch {
                // Too big for the backing file system: put the old last block back.
                try? resizeBlock(index, from: newLength, to: oldLength, fileID: id)
                try? Sys.truncate(fd, to: BlockLayout.cipherSize(plainSize: oldSize))
                throw error
            }
            return
        }
        try Sys.truncate(fd, to: BlockLayout.cipherSize(plainSize: newSize))
    }
}
