// ContentFile reads and writes plaintext at any offset of one encrypted backing file:
// block read-modify-write, holes, truncation up and down, and putting back blocks that
// a crash tore (from the undo journal).
//
// Thread safety: writes are read-modify-write of whole blocks and the file ID is cached
// in a FileIDCache shared by every ContentFile of the same backing inode, so callers
// serialise writes and truncates against everything else on that inode (PlainFileSystem
// holds a per-node reader-writer lock); concurrent reads are safe.
//
// Crash safety: a rewrite of a block that keeps some of its old bytes records the old
// slot in the undo journal first (durably if the block may hold fsynced bytes); a write
// or truncate that fails (ENOSPC) puts back the slots it overwrote and the old size.
import CofferCrypto
import CofferSystem
import Glibc
import Synchronization

/// The file ID of one backing inode, cached once read; shared by all its open files.
public final class FileIDCache: Sendable {
    private let id = Mutex<FileID?>(nil)
    public init() {}

    var fileID: FileID? {
        get { id.withLock { $0 } }
        set { id.withLock { $0 = newValue } }
    }

    /// Forgets the ID: another program may have rewritten the file's header.
    public func forget() { fileID = nil }
}

/// What makes in-place rewrites of one inode crash-safe: the vault's undo journal, the
/// blocks written since the inode's last fsync, and whether the descriptor's writes
/// reach the disk before they return (O_SYNC, O_DSYNC).
public struct RewriteSafety {
    public let journal: UndoJournal
    public let volatile: VolatileBlocks
    public let synchronous: Bool

    public init(journal: UndoJournal, volatile: VolatileBlocks, synchronous: Bool = false) {
        self.journal = journal
        self.volatile = volatile
        self.synchronous = synchronous
    }
}

public struct ContentFile {
    /// The backing file, opened for reading (and writing, for writes).
    public let fd: Int32
    private let cipher: ContentCipher
    /// The vault's block layout (its format's).
    public let layout: BlockLayout
    private let ids: FileIDCache
    private let safety: RewriteSafety?

    public init(fd: Int32, cipher: ContentCipher, layout: BlockLayout, ids: FileIDCache = FileIDCache(),
                safety: RewriteSafety? = nil) {
        self.fd = fd
        self.cipher = cipher
        self.layout = layout
        self.ids = ids
        self.safety = safety
    }

    /// The plaintext size, from the backing file's size.
    public func plainSize() throws -> Int64 {
        try layout.plainSize(cipherSize: Int64(Sys.stat(fd).st_size))
    }

    /// The header as it is on disk (read each time: its place tag may change).
    public func header() throws -> FileHeader {
        var bytes = [UInt8](repeating: 0, count: Int(layout.headerSize))
        let n = try bytes.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: 0) }
        if n == 0 && layout.endsInFinalBlock { throw VaultError.fileTruncated(cipherSize: 0) }
        return try FileHeader(parsing: Array(bytes.prefix(n)), layout: layout)
    }

    /// The file ID from the header, or nil for an empty file (up to format 3; from format
    /// 4 every file has a header).
    public func fileID() throws -> FileID? { try fileIDAndHeader().id }

    /// `fileID()`, with the header if it had to be read for it (nil when the ID was known).
    public func fileIDAndHeader() throws -> (id: FileID?, header: FileHeader?) {
        if let id = ids.fileID { return (id, nil) }
        if !layout.endsInFinalBlock, try Sys.stat(fd).st_size == 0 { return (nil, nil) }
        let header = try header()
        ids.fileID = header.fileID
        return (header.fileID, header)
    }

    /// Makes the header of an empty file up to format 3.
    private func createHeader() throws -> FileID {
        let header = FileHeader(version: layout.headerVersion, fileID: .random())
        try header.bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: 0) }
        ids.fileID = header.fileID
        return header.fileID
    }

    /// Makes a new empty file (format 4): a header with a new file ID and the place tag
    /// `tag` gives for it, and an empty final block, in one pwrite at offset 0 of an empty
    /// backing file.
    /// `sealed` (format 6): a file made while locked, of file ID `id`, whose key is
    /// sealed to the drop key (header version 3, its place tag zero until the unlock).
    /// `wrapped` (format 8): the file of ID `id` whose own key this file's cipher holds,
    /// wrapped in the header as `wrap`; a file made while locked (`sealed`) has a wrap of
    /// zeros (header version 4 either way).
    public func initialize(sealed sealedID: FileID? = nil, wrapped: (id: FileID, wrap: [UInt8])? = nil,
                           placeTag tag: (FileID) throws -> [UInt8]) throws {
        precondition(layout.endsInFinalBlock && (wrapped == nil || layout == .wrapped))
        let id = sealedID ?? wrapped?.id ?? FileID.random()
        let header: FileHeader
        if layout == .wrapped {
            precondition(wrapped != nil || sealedID != nil, "a format-8 file has its key wrapped, or sealed while locked")
            header = FileHeader(version: layout.headerVersion, fileID: id, placeTag: try tag(id),
                                keyWrap: wrapped?.wrap ?? [UInt8](repeating: 0, count: FileKeyWrap.size))
        } else {
            header = FileHeader(version: sealedID != nil ? FileHeader.sealedVersion : layout.headerVersion, fileID: id, placeTag: try tag(id))
        }
        let final = try sealedFinalBlock(0, length: 0, fileID: id)
        try (header.bytes + final).withUnsafeBytes { try Sys.writeFully(fd, $0, at: 0) }
        ids.fileID = id
    }

    /// Writes `tag` as the header's place tag (format 4). The file's times stay as they
    /// were: a tag is no content, and a rename or link must not look like a change to
    /// rsync -a, make or a backup. `times`: the atime and mtime to keep, if the caller
    /// has just read them (else they are read here).
    /// `keyWrap` (format 8): the file's key wrapped anew (a move into the other key
    /// domain), written after the tag in the same pwrite.
    public func setPlaceTag(_ tag: [UInt8], keyWrap: [UInt8]? = nil, keeping times: [timespec]? = nil) throws {
        precondition(layout.endsInFinalBlock && tag.count == PlaceMAC.tagSize && (keyWrap == nil || layout == .wrapped))
        let times = try times ?? { let before = try Sys.stat(fd); return [before.st_atim, before.st_mtim] }()
        try (tag + (keyWrap ?? [])).withUnsafeBytes { try Sys.writeFully(fd, $0, at: Int64(FileHeader.placeTagOffset)) }
        try Sys.setTimes(open: fd, times)
    }

    /// The backing file's size, and the plaintext size it means.
    private func sizes() throws -> (cipher: Int64, plain: Int64) {
        let cipher = Int64(try Sys.stat(fd).st_size)
        return (cipher, try layout.plainSize(cipherSize: cipher))
    }

    /// The final block of `length` zero bytes (format 4), sealed as block `index`.
    private func sealedFinalBlock(_ index: Int64, length: Int, fileID id: FileID) throws -> [UInt8] {
        var sealed = [UInt8](repeating: 0, count: length + ContentCipher.overhead)
        let zeros = [UInt8](repeating: 0, count: length)
        try zeros.withUnsafeBytes { plain in
            try sealed.withUnsafeMutableBytes { try cipher.sealFinalBlock(plain, index: UInt64(index), fileID: id, into: $0) }
        }
        return sealed
    }

    /// Writes a final block of `length` zero bytes as block `index` (format 4); the file
    /// then ends with it.
    private func writeFinalBlock(_ index: Int64, length: Int, fileID id: FileID) throws {
        let at = layout.cipherOffset(block: index)
        try sealedFinalBlock(index, length: length, fileID: id).withUnsafeBytes { try Sys.writeFully(fd, $0, at: at) }
        try Sys.truncate(fd, to: at + Int64(length + ContentCipher.overhead))
    }

    /// Checks the final block (format 4): the file's length is authenticated by it, so a
    /// file cut anywhere — at a block boundary too — fails here.
    public func checkFinalBlock() throws {
        guard layout.endsInFinalBlock else { return }
        _ = try checkedHeader()
    }

    /// Files up to this many ciphertext bytes are read in one pread by `checkedHeader`.
    static let smallFile: Int64 = 16 << 10

    /// At open (format 4): the header as it is on disk, after checking the final block —
    /// for a small file both in one pread, else the header and the final block apart.
    public func checkedHeader() throws -> FileHeader {
        precondition(layout.endsInFinalBlock)
        let cipherSize = Int64(try Sys.stat(fd).st_size)
        let size = try layout.plainSize(cipherSize: cipherSize)
        let index = BlockLayout.finalBlock(plainSize: size)
        let length = BlockLayout.blockLength(index, plainSize: size)
        let at = layout.cipherOffset(block: index), headerSize = Int(layout.headerSize)
        let whole = cipherSize <= Self.smallFile
        var bytes = [UInt8](repeating: 0, count: whole ? Int(cipherSize) : headerSize)
        let n = try bytes.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: 0) }
        guard n == bytes.count else { throw VaultError.fileTruncated(cipherSize: Int64(n)) }
        let header = try FileHeader(parsing: Array(bytes[0..<headerSize]), layout: layout)
        ids.fileID = header.fileID
        let sealed: ArraySlice<UInt8>
        if whole {
            sealed = bytes[Int(at)...]
        } else {
            var tail = [UInt8](repeating: 0, count: length + ContentCipher.overhead)
            let m = try tail.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: at) }
            guard m == tail.count else { throw VaultError.fileTruncated(cipherSize: at + Int64(m)) }
            sealed = tail[...]
        }
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, length), alignment: 16)
        defer { plain.deallocateZeroed() }
        do {
            _ = try sealed.withUnsafeBytes {
                try cipher.openFinalBlock($0, index: UInt64(index), fileID: header.fileID,
                                          into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<length]))
            }
        } catch is CryptoError {
            throw VaultError.blockDamaged(blockIndex: UInt64(index))
        }
        return header
    }

    // MARK: Reading

    /// Reads up to `buffer.count` plaintext bytes at `offset`; returns how many (0 at EOF).
    /// Throws `blockDamaged` naming the first block in the range that fails authentication.
    /// One pread and no fstat: how much there is follows from how much pread returned.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        guard buffer.count > 0, offset >= 0 else { return 0 }
        let first = BlockLayout.blockIndex(plainOffset: offset)
        let last = BlockLayout.blockIndex(plainOffset: offset + Int64(buffer.count) - 1)
        let cipherStart = layout.cipherOffset(block: first)
        let scratch = UnsafeMutableRawBufferPointer.allocate(
            byteCount: Int(last - first + 1) * ContentCipher.cipherBlockSize, alignment: 16)
        defer { scratch.deallocate() }
        let n = try Sys.readFully(fd, into: scratch, at: cipherStart)
        let (available, endsInOverhead) = layout.plainBytes(inCipherBytes: n)
        let skip = Int(offset - first * BlockLayout.plainBlockSize)
        let wanted = min(buffer.count, available - skip)
        if endsInOverhead && skip + buffer.count > available {
            // Cut inside a block's nonce or tag: the whole blocks before still read.
            throw VaultError.fileTruncated(cipherSize: cipherStart + Int64(n))
        }
        guard wanted > 0, let id = try fileID() else { return 0 }
        // Open only the blocks that hold the wanted bytes.
        let plainLength = min(available, BlockLayout.wholeBlocks(plainLength: skip + wanted))
        let sealed = UnsafeRawBufferPointer(rebasing: scratch[0..<ContentCipher.cipherLength(plainLength: plainLength)])
        if skip == 0 && wanted == plainLength {
            try open(sealed, first: first, fileID: id, into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<wanted]))
        } else {
            let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: plainLength, alignment: 16)
            defer { plain.deallocateZeroed() }
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

    /// The stored slot of one block: nonce ‖ ciphertext ‖ tag (all zeros for a hole).
    private struct Slot {
        let index: Int64
        /// Plaintext bytes the block holds.
        let length: Int
        let bytes: [UInt8]
    }

    /// Reads the slot of block `index` in a file of `plainSize` bytes and, with `plain`,
    /// opens it there.
    private func readSlot(_ index: Int64, plainSize: Int64, fileID id: FileID,
                          into plain: UnsafeMutableRawBufferPointer? = nil) throws -> Slot {
        let length = BlockLayout.blockLength(index, plainSize: plainSize)
        var bytes = [UInt8](repeating: 0, count: ContentCipher.cipherLength(plainLength: length))
        let at = layout.cipherOffset(block: index)
        let n = try bytes.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: at) }
        guard n == bytes.count else { throw VaultError.fileTruncated(cipherSize: at + Int64(n)) }
        if let plain { try bytes.withUnsafeBytes { try open($0, first: index, fileID: id, into: plain) } }
        return Slot(index: index, length: length, bytes: bytes)
    }

    // MARK: Writing

    /// How to put a file back as it was before a write or truncate that failed: the old
    /// slots it overwrote (restored last to first), then the old ciphertext size.
    private struct Undo {
        let cipherSize: Int64
        var slots: [(offset: Int64, bytes: [UInt8])] = []
    }

    private func restore(_ undo: Undo) {
        for slot in undo.slots.reversed() {
            try? slot.bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: slot.offset) }
        }
        try? Sys.truncate(fd, to: undo.cipherSize)
        if undo.cipherSize == 0 { ids.fileID = nil }
    }

    /// Writes `data` at plaintext `offset`, extending the file (with holes) if needed.
    /// If it fails (ENOSPC), the file is as it was.
    /// Writes `data` at plaintext `offset`. `check` is given the backing file's status,
    /// the one this write reads for its size, before anything is written: what it throws
    /// ends the write with nothing written.
    public func write(_ data: UnsafeRawBufferPointer, at offset: Int64, checking check: (stat) throws -> Void = { _ in }) throws {
        guard data.count > 0 else { return }
        try BlockLayout.checkSize(offset + Int64(data.count))
        let st = try Sys.stat(fd)
        try check(st)
        let cipherSize = Int64(st.st_size), oldSize = try layout.plainSize(cipherSize: cipherSize)
        var undo = Undo(cipherSize: cipherSize)
        do {
            try write(data, at: offset, cipherSize: cipherSize, plainSize: oldSize, undo: &undo)
        } catch {
            restore(undo)
            throw error
        }
    }

    private func write(_ data: UnsafeRawBufferPointer, at offset: Int64, cipherSize: Int64, plainSize oldSize: Int64,
                       undo: inout Undo) throws {
        let plan = WritePlan(offset: offset, count: data.count, plainSize: oldSize, cipherSize: cipherSize, layout: layout)
        // An empty file (formats 1–3) gets its header with the first write.
        var pendingHeader: FileHeader?
        let id: FileID
        if plan.header == .present {
            guard let known = try fileID() else { throw VaultError.fileTruncated(cipherSize: cipherSize) }
            id = known
        } else {
            let header = FileHeader(version: layout.headerVersion, fileID: .random())
            if plan.header == .withBlocks {
                pendingHeader = header
            } else {
                try header.bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: 0) }
            }
            ids.fileID = header.fileID
            id = header.fileID
        }
        if let grown = plan.grown {
            try resize(grown, plainSize: oldSize, to: Int(BlockLayout.plainBlockSize), fileID: id, undo: &undo)
        }
        if plan.direct {
            return try commit(data, firstBlock: plan.first, fileID: id, header: pendingHeader, plainSize: plan.plainSize,
                              kept: [], finalAfter: plan.finalAfter, undo: &undo)
        }
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(plan.regionEnd - plan.regionStart), alignment: 16)
        defer { plain.deallocateZeroed() }
        plain.initializeMemory(as: UInt8.self, repeating: 0)
        var kept: [Slot] = []
        if plan.keepsFirst {
            let length = BlockLayout.blockLength(plan.first, plainSize: plan.plainSize)
            kept.append(try readSlot(plan.first, plainSize: plan.plainSize, fileID: id,
                                     into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<length])))
        }
        if plan.keepsLast {
            let length = BlockLayout.blockLength(plan.last, plainSize: plan.plainSize)
            let at = Int((plan.last - plan.first) * BlockLayout.plainBlockSize)
            kept.append(try readSlot(plan.last, plainSize: plan.plainSize, fileID: id,
                                     into: UnsafeMutableRawBufferPointer(rebasing: plain[at..<at + length])))
        }
        (plain.baseAddress! + Int(offset - plan.regionStart)).copyMemory(from: data.baseAddress!, byteCount: data.count)
        try commit(UnsafeRawBufferPointer(plain), firstBlock: plan.first, fileID: id, header: pendingHeader,
                   plainSize: plan.plainSize, kept: kept, finalAfter: plan.finalAfter, undo: &undo)
    }

    /// Seals `plain` as the blocks from `firstBlock` of a file now `plainSize` bytes long
    /// and writes them in one pwrite, after `header` if one is given (then `firstBlock`
    /// is 0), and with `finalAfter` an empty final block after them (format 4: `plain`
    /// ends the file at a block boundary). The old slots it keeps bytes of (`kept`), and
    /// those of blocks that have an undo record, are recorded in the journal first;
    /// `undo` learns what to put back.
    private func commit(_ plain: UnsafeRawBufferPointer, firstBlock: Int64, fileID id: FileID, header: FileHeader?,
                        plainSize: Int64, kept: [Slot], finalAfter: Bool = false, undo: inout Undo) throws {
        let prefix = header?.bytes.count ?? 0
        let length = ContentCipher.cipherLength(plainLength: plain.count)
        let lastBlock = firstBlock + BlockLayout.blockIndex(plainOffset: Int64(plain.count - 1))
        let final = finalAfter ? try sealedFinalBlock(lastBlock + 1, length: 0, fileID: id) : []
        let sealed = UnsafeMutableRawBufferPointer.allocate(byteCount: prefix + length + final.count, alignment: 16)
        defer { sealed.deallocate() }
        if let header { header.bytes.withUnsafeBytes { sealed.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: prefix) } }
        try cipher.sealInParallel(plain, firstBlock: UInt64(firstBlock), fileID: id,
                              into: UnsafeMutableRawBufferPointer(rebasing: sealed[prefix..<prefix + length]))
        final.withUnsafeBytes { (sealed.baseAddress! + prefix + length).copyMemory(from: $0.baseAddress!, byteCount: final.count) }
        let start = layout.cipherOffset(block: firstBlock) - Int64(prefix)

        // What a failure puts back: the slots recorded, and all that was overwritten
        // when the write also grows the file.
        let records = safety.map { safety in
            WritePlan.Records(blocks: firstBlock...lastBlock, plainSize: plainSize, kept: kept.map(\.index),
                              recorded: safety.journal.recordedBlocks(id).map(Array.init) ?? [], volatile: safety.volatile.contains)
        }
        var slots = kept
        for block in records?.extra ?? [] { slots.append(try readSlot(block, plainSize: plainSize, fileID: id)) }
        let cipherSize = layout.cipherSize(plainSize: plainSize)
        if start + Int64(sealed.count) > cipherSize && start < cipherSize
            && !(slots.count == 1 && layout.cipherOffset(block: slots[0].index) == start
                 && Int64(slots[0].bytes.count) == cipherSize - start) {
            var old = [UInt8](repeating: 0, count: Int(cipherSize - start))
            _ = try old.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: start) }
            undo.slots.append((start, old))
        }
        undo.slots += slots.map { (layout.cipherOffset(block: $0.index), $0.bytes) }

        let write = { try Sys.writeFully(self.fd, UnsafeRawBufferPointer(sealed), at: start) }
        if let safety, let records, !slots.isEmpty {
            let entries = slots.map { slot -> UndoJournal.Record in
                let at = Int(layout.cipherOffset(block: slot.index) - start)
                return UndoJournal.Record(fileID: id, block: slot.index, oldLength: slot.length,
                                          newNonce: Array(sealed[at..<at + ContentCipher.nonceSize]), sealed: slot.bytes)
            }
            // A block not known to be volatile may hold fsynced bytes: its record must
            // be on the disk before the slot is touched.
            try safety.journal.rewriting {
                try safety.journal.append(entries, durable: records.durable)
                try write()
            }
        } else {
            try write()
        }
        if let safety, let records {
            if safety.synchronous {
                safety.volatile.remove(firstBlock...lastBlock)
            } else {
                // A block keeping bytes it may have held at the last fsync still holds them:
                // it stays durable, and so does the record of its next rewrite (a ring
                // record lost in a cut would leave that rewrite's tear matching no record).
                safety.volatile.insert(firstBlock...lastBlock)
                for block in records.stayDurable { safety.volatile.remove(block...block) }
            }
        }
    }

    /// Re-seals block `index` of a file of `plainSize` bytes with a new plaintext length
    /// (cut, or zero-extended).
    private func resize(_ index: Int64, plainSize: Int64, to newLength: Int, fileID id: FileID, undo: inout Undo) throws {
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(BlockLayout.plainBlockSize), alignment: 16)
        defer { plain.deallocateZeroed() }
        plain.initializeMemory(as: UInt8.self, repeating: 0)
        let oldLength = BlockLayout.blockLength(index, plainSize: plainSize)
        // An empty final block (format 4) has no bytes to keep.
        let kept = oldLength == 0 ? [] : [try readSlot(index, plainSize: plainSize, fileID: id,
                                                       into: UnsafeMutableRawBufferPointer(rebasing: plain[0..<oldLength]))]
        try commit(UnsafeRawBufferPointer(rebasing: plain[0..<newLength]), firstBlock: index, fileID: id, header: nil,
                   plainSize: plainSize, kept: kept, undo: &undo)
    }

    /// Sets the plaintext size. Growing leaves holes (no encrypted zeros are written
    /// beyond the old last block); shrinking re-seals the new last block if it is partial.
    /// If it fails (ENOSPC), the file is as it was.
    public func truncate(to newSize: Int64) throws {
        // Emptying needs no block, so it works on a damaged file too (from format 4, one
        // whose header is intact: the header stays, with the file's place).
        if newSize == 0 {
            guard layout.endsInFinalBlock else {
                try Sys.truncate(fd, to: 0)
                ids.fileID = nil
                return
            }
            let id = try header().fileID
            ids.fileID = id
            try Sys.truncate(fd, to: layout.headerSize)
            return try writeFinalBlock(0, length: 0, fileID: id)
        }
        try BlockLayout.checkSize(newSize)
        let (cipherSize, oldSize) = try sizes()
        guard newSize != oldSize else { return }
        var undo = Undo(cipherSize: cipherSize)
        do {
            let id = try fileID() ?? createHeader()
            if layout.endsInFinalBlock {
                try truncateEndingInFinalBlock(to: newSize, from: oldSize, fileID: id, undo: &undo)
            } else if newSize < oldSize {
                let index = BlockLayout.blockIndex(plainOffset: newSize)
                let keep = Int(newSize % BlockLayout.plainBlockSize)
                if keep != 0 { try resize(index, plainSize: oldSize, to: keep, fileID: id, undo: &undo) }
            } else if oldSize % BlockLayout.plainBlockSize != 0 {
                let index = BlockLayout.blockIndex(plainOffset: oldSize)
                try resize(index, plainSize: oldSize, to: BlockLayout.blockLength(index, plainSize: newSize),
                           fileID: id, undo: &undo)
            }
            try Sys.truncate(fd, to: layout.cipherSize(plainSize: newSize))
        } catch {
            restore(undo)
            throw error
        }
    }

    /// `truncate` from format 4: the file ends in a final block of newSize mod 4096 bytes.
    /// Shrinking to a block boundary cuts the file first and then writes the empty final
    /// block (a crash between leaves a cut that the crash check repairs, never a block
    /// half overwritten); growing seals the old final block at full length (or at its
    /// new length, within one block) and writes the new final block, which extends the
    /// file with holes between.
    private func truncateEndingInFinalBlock(to newSize: Int64, from oldSize: Int64, fileID id: FileID,
                                            undo: inout Undo) throws {
        let oldFinal = BlockLayout.finalBlock(plainSize: oldSize), newFinal = BlockLayout.finalBlock(plainSize: newSize)
        let newLength = BlockLayout.blockLength(newFinal, plainSize: newSize)
        if newSize < oldSize {
            if newLength != 0 {
                try resize(newFinal, plainSize: oldSize, to: newLength, fileID: id, undo: &undo)
                try Sys.truncate(fd, to: layout.cipherSize(plainSize: newSize))
            } else {
                try Sys.truncate(fd, to: layout.cipherOffset(block: newFinal))
                try writeFinalBlock(newFinal, length: 0, fileID: id)
            }
        } else if newFinal == oldFinal {
            try resize(oldFinal, plainSize: oldSize, to: newLength, fileID: id, undo: &undo)
        } else {
            try resize(oldFinal, plainSize: oldSize, to: Int(BlockLayout.plainBlockSize), fileID: id, undo: &undo)
            try writeFinalBlock(newFinal, length: newLength, fileID: id)
        }
    }

    // MARK: After a crash

    /// The blocks of this file that a crash tore and that an undo record of each
    /// (`records`, by block, the newest first) puts back; with `repair`, they are put
    /// back (and the file's size set to what it was with that slot). For a block that
    /// fails authentication, the records are tried newest first (`RecoveryPlan`).
    public func tornBlocks(_ records: [Int64: [UndoJournal.Record]], repair: Bool) throws -> [Int64] {
        guard let id = try fileID() else { return [] }
        var found: [Int64] = []
        var probe = [UInt8](repeating: 0, count: 1)
        for (block, candidates) in records.sorted(by: { $0.key < $1.key }) {
            do {
                _ = try probe.withUnsafeMutableBytes { try read(into: $0, at: block * BlockLayout.plainBlockSize) }
                continue
            } catch is VaultError {}
            let at = layout.cipherOffset(block: block)
            var nonce = [UInt8](repeating: 0, count: ContentCipher.nonceSize)
            _ = try nonce.withUnsafeMutableBytes { try Sys.readFully(fd, into: $0, at: at) }
            let opens = { (record: UndoJournal.Record) -> Bool in
                var plain = [UInt8](repeating: 0, count: record.oldLength)
                defer { for i in plain.indices { plain[i] = 0 } }
                return (try? record.sealed.withUnsafeBytes { sealed in
                    try plain.withUnsafeMutableBytes { try cipher.open(sealed, firstBlock: UInt64(block), fileID: id, into: $0) }
                }) != nil
            }
            guard let record = RecoveryPlan.record(for: nonce, among: candidates, opens: opens) else { continue }
            found.append(block)
            guard repair else { continue }
            try record.sealed.withUnsafeBytes { try Sys.writeFully(fd, $0, at: at) }
            let end = at + Int64(record.sealed.count)
            let size = Int64(try Sys.stat(fd).st_size)
            if record.oldLength < ContentCipher.blockSize || size < end {
                try Sys.truncate(fd, to: end)
            }
            try Sys.fdatasync(fd)
        }
        return found
    }
}

extension ContentFile {
    /// Most blocks a torn tail may span: what a crash leaves of appends the disk had not
    /// finished; a longer run of failing blocks is damage, not a tear.
    public static let tornTailLimit = 256

    /// After a crash: if the file's last blocks fail authentication (an append the crash
    /// tore, its bytes written after the file's last fsync: a block that held fsynced
    /// bytes is rewritten only under an undo record, applied before this), the number of
    /// plaintext bytes the file keeps — up to the end of its last block that opens — and
    /// with `repair` the file is cut there. Nil if the last block opens, or if more than
    /// `tornTailLimit` blocks fail (damage, left as it is). From format 4 the file then
    /// ends in a new empty final block: what the crash left without one (a file cut at a
    /// block boundary, or whose final block is torn) is cut back to its last whole block
    /// that opens.
    public func tornTail(repair: Bool) throws -> Int64? {
        let cipherSize = Int64(try Sys.stat(fd).st_size)
        let ending = layout.endsInFinalBlock
        if ending {
            guard cipherSize >= layout.headerSize, (try? fileID()) != nil, (try? checkFinalBlock()) == nil else { return nil }
        } else {
            guard cipherSize > layout.headerSize else { return nil }
        }
        // Slots on the disk: from format 4 only whole ones count (the final block failed).
        let blocks = layout.slots(cipherSize: cipherSize, countingPartial: !ending)
        var probe = [UInt8](repeating: 0, count: 1)
        var kept = blocks
        while kept > 0 {
            do {
                _ = try probe.withUnsafeMutableBytes { try read(into: $0, at: (kept - 1) * BlockLayout.plainBlockSize) }
                break
            } catch is VaultError {
                kept -= 1
                if blocks - kept > Int64(Self.tornTailLimit) { return nil }
            }
        }
        guard kept < blocks || ending else { return nil }
        if repair {
            if ending, let id = try fileID() {
                try Sys.truncate(fd, to: layout.cipherOffset(block: kept))
                try writeFinalBlock(kept, length: 0, fileID: id)
            } else {
                try Sys.truncate(fd, to: layout.cipherSize(plainSize: kept * BlockLayout.plainBlockSize))
            }
            try Sys.fdatasync(fd)
        }
        return kept * BlockLayout.plainBlockSize
    }
}

/// Which undo record puts a torn block back (FORMAT.md §11), decided apart from the
/// reading and writing: pure, and unit-tested on its own.
public enum RecoveryPlan {
    /// The record to apply to a block that fails authentication and whose slot on disk
    /// starts with `nonce`, among `records` of that block (the newest first), or nil.
    /// Records are tried newest first; one applies if its old slot `opens` and the slot
    /// on disk carries a nonce of its rewrite or of a later one (its old nonce, or the
    /// new nonce of it or of any newer record): the tear is then of a rewrite it
    /// precedes. So when the newest record is itself torn (its old slot half on disk),
    /// the one before it — a durable record holding the last fsynced slot — still
    /// puts the block back.
    public static func record(for nonce: [UInt8], among records: [UndoJournal.Record],
                              opens: (UndoJournal.Record) -> Bool) -> UndoJournal.Record? {
        var laterNonces: [ArraySlice<UInt8>] = []
        for record in records {
            laterNonces.append(record.newNonce[...])
            let tornHere = nonce[...] == record.oldNonce || laterNonces.contains { $0 == nonce[...] }
            if tornHere && opens(record) { return record }
        }
        return nil
    }
}

extension UnsafeMutableRawBufferPointer {
    /// Zeroes a buffer that held plaintext, then frees it: freed heap memory must not keep
    /// file contents after a lock (explicit_bzero is not optimised away).
    func deallocateZeroed() {
        if let base = baseAddress { explicit_bzero(base, count) }
        deallocate()
    }
}
