// UndoJournal keeps, in `coffer.journal` of the machine's state directory for the vault
// (never in CIPHERDIR, which a sync engine may carry to other machines), the old sealed
// form of each content block that coffer rewrites in place while the rewrite keeps some
// of its bytes, so that a crash in the middle of the rewrite (kill -9, power cut) cannot
// make those bytes unreadable (FORMAT.md §11).
//
// A block's slot is rewritten in place, with a new nonce and length, when a write
// covers only part of it, when an append grows a partial last block, and when a
// truncate cuts it. Torn — new bytes on the disk before the new size, or half of the
// slot written — it authenticates as neither version. So the old slot goes into a
// record first; when the block may hold fsynced bytes, the record is fdatasynced before
// the slot is touched. After a crash, a block that fails authentication while its slot
// still carries the old or the new nonce of its newest record is put back from it.
import CofferCrypto
import CofferSystem
import Dispatch
import Glibc
import Synchronization

public final class UndoJournal: Sendable {
    public static let fileName = "coffer.journal"

    /// Whether the journal file exists in `directory`.
    public static func exists(in directory: Int32) -> Bool { (try? Sys.stat(fileName, in: directory)) != nil }

    /// Removes the journal file of `directory` (one an older coffer kept in CIPHERDIR).
    public static func remove(in directory: Int32) throws { try Sys.unlink(fileName, in: directory) }
    static let magic = Array("cofferU1".utf8)
    /// Bytes before the old slot: magic 8 ‖ file ID 16 ‖ u64 block ‖ u64 sequence ‖
    /// u32 old length ‖ u32 zero ‖ new nonce 24.
    static let headerSize = 72
    /// Bytes per record: the header and room for a full slot (4136).
    public static let recordSize = headerSize + Int(BlockLayout.cipherBlockSize)
    /// Records 0…255 are a ring for rewrites of blocks not fsynced since they were last
    /// written (only a kill -9 can need them, and only while their rewrite runs); durable
    /// records are appended after the ring.
    public static let ringSlots = 256
    /// Size past which the durable records are dropped after a syncfs: about 2,000 records.
    static let trimThreshold = Int64(ringSlots * recordSize) + (8 << 20)

    /// One rewrite: block `block` of file `fileID` held `oldLength` plaintext bytes in
    /// the slot `sealed` (nonce ‖ ciphertext ‖ tag, all zeros for a hole) and is being
    /// replaced by a slot that starts with `newNonce`.
    public struct Record: Sendable {
        public let fileID: FileID
        public let block: Int64
        public let oldLength: Int
        public let newNonce: [UInt8]
        public let sealed: [UInt8]
        /// Order of records: a later rewrite of the same block has a higher number.
        var sequence: UInt64 = 0

        public init(fileID: FileID, block: Int64, oldLength: Int, newNonce: [UInt8], sealed: [UInt8]) {
            precondition(newNonce.count == ContentCipher.nonceSize && sealed.count == oldLength + ContentCipher.overhead)
            self.fileID = fileID
            self.block = block
            self.oldLength = oldLength
            self.newNonce = newNonce
            self.sealed = sealed
        }

        /// The nonce of the old slot.
        var oldNonce: ArraySlice<UInt8> { sealed.prefix(ContentCipher.nonceSize) }

        var encoded: [UInt8] {
            var out = UndoJournal.magic + fileID.bytes
            withUnsafeBytes(of: UInt64(block).bigEndian) { out += $0 }
            withUnsafeBytes(of: sequence.bigEndian) { out += $0 }
            withUnsafeBytes(of: UInt32(oldLength).bigEndian) { out += $0 }
            out += [0, 0, 0, 0] + newNonce + sealed
            return out + [UInt8](repeating: 0, count: UndoJournal.recordSize - out.count)
        }

        /// Parses a record; nil for anything torn or foreign (a short, zeroed or
        /// half-written record is simply not there; a slot that is torn fails later,
        /// when it is opened).
        init?(parsing b: [UInt8]) {
            guard b.count == UndoJournal.recordSize, b.prefix(8).elementsEqual(UndoJournal.magic) else { return nil }
            let number = { (range: Range<Int>) in b[range].reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
            let block = number(24..<32), length = Int(number(40..<44))
            guard length >= 1, length <= ContentCipher.blockSize,
                  block <= UInt64(BlockLayout.maxPlainSize / BlockLayout.plainBlockSize) else { return nil }
            let start = UndoJournal.headerSize
            self.init(fileID: FileID(bytes: Array(b[8..<24])), block: Int64(block), oldLength: length,
                      newNonce: Array(b[48..<72]), sealed: Array(b[start..<start + length + ContentCipher.overhead]))
            sequence = number(32..<40)
        }
    }

    /// The journal file was there before this open: the last mount of the vault on this
    /// machine did not end cleanly (a clean end removes it; see `removeIfEmpty`), so
    /// its files may hold blocks the crash tore.
    public let foundAtOpen: Bool
    /// The directory holding the journal: a descriptor of the journal's own.
    private let directory: FileDescriptor
    /// A descriptor on the file system of the vault's data (CIPHERDIR), which a trim
    /// makes durable (syncfs) before it drops records.
    private let data: FileDescriptor
    /// Readers: a recorded rewrite, from its records to the end of its pwrite.
    /// Writer: dropping records, which must meet no rewrite half done. Taken before
    /// `state` (lock order: see PlainFileSystem's `gate`).
    private let rewrites = ReadWriteLock()
    /// A trim has been handed to a background thread and has not ended yet.
    private let trimming = Atomic<Bool>(false)

    private struct State: ~Copyable, Sendable {
        var file: FileDescriptor
        /// End of the durable records.
        var size: Int64 = 0
        var nextRingSlot = 0
        var sequence: UInt64 = 1
        /// Records on the disk, counted per file and block: a rewrite of such a block is
        /// always recorded, so that the newest record of a block describes its last rewrite.
        /// A ring record stops counting when its slot is reused, so this stays small.
        var recorded: [FileID: [Int64: Int]] = [:]
        /// What each ring slot holds.
        var ring = [(fileID: FileID, block: Int64)?](repeating: nil, count: UndoJournal.ringSlots)
        /// Records found at open (left by an earlier daemon), every one per block, until
        /// each file has been checked: they are what a crash may need (the newest first,
        /// an older one where the newest was itself torn; see `ContentFile.tornBlocks`).
        var pending: [FileID: [Int64: [Record]]] = [:]

        init(file: consuming FileDescriptor) { self.file = file }

        /// Counts a record of `block` of `fileID` in (+1) or out (-1).
        mutating func count(_ fileID: FileID, _ block: Int64, _ delta: Int) {
            let n = (recorded[fileID]?[block] ?? 0) + delta
            if n > 0 {
                recorded[fileID, default: [:]][block] = n
            } else {
                recorded[fileID]?[block] = nil
                if recorded[fileID]?.isEmpty == true { recorded[fileID] = nil }
            }
        }
    }

    /// The journal file and what is known of its records; a leaf lock.
    private let state: Mutex<State>

    /// Opens (or creates) the journal in `directory`, for the vault whose data is on the
    /// file system of `data` (`vault.root`; by default the journal's own directory).
    /// Never follows or blocks on something planted in its place. Both descriptors are
    /// only borrowed: the journal keeps descriptors of its own of the same directories
    /// (opened through them, not by a path).
    public init(directory: Int32, data: Int32? = nil, readOnly: Bool = false) throws {
        foundAtOpen = Self.exists(in: directory)
        self.directory = try FileDescriptor.open(".", in: directory, flags: O_PATH | O_DIRECTORY)
        self.data = try FileDescriptor.open(".", in: data ?? directory, flags: O_RDONLY | O_DIRECTORY)
        var state = State(file: try Self.openFile(in: directory, readOnly: readOnly))
        let file = state.file.rawValue
        let records = Int(try Sys.stat(file).st_size) / Self.recordSize
        var buffer = [UInt8](repeating: 0, count: Self.recordSize)
        for i in 0..<records {
            let n = try buffer.withUnsafeMutableBytes { try Sys.readFully(file, into: $0, at: Int64(i * Self.recordSize)) }
            guard n == Self.recordSize, let record = Record(parsing: buffer) else { continue }
            state.sequence = max(state.sequence, record.sequence + 1)
            state.count(record.fileID, record.block, +1)
            if i < Self.ringSlots { state.ring[i] = (record.fileID, record.block) }
            state.pending[record.fileID, default: [:]][record.block, default: []].append(record)
        }
        state.size = Int64(max(records, Self.ringSlots) * Self.recordSize)
        self.state = Mutex(state)
    }

    private static func openFile(in directory: Int32, readOnly: Bool) throws -> FileDescriptor {
        do {
            return try FileDescriptor.openRegular(fileName, in: directory, flags: readOnly ? O_RDONLY : O_RDWR | O_CREAT, mode: 0o600)
        } catch let error as Errno where error.code == EINVAL {
            throw VaultError.journalDamaged(reason: "\(fileName) is not a regular file")
        } catch let error as Errno where error.code == ELOOP {
            throw VaultError.journalDamaged(reason: "\(fileName) is a symlink")
        }
    }

    /// The journal file's descriptor, for tests that tear a record by hand.
    var fileDescriptorForTests: Int32 { state.withLock { $0.file.rawValue } }

    /// True while records of an earlier daemon wait for their files to be checked.
    public var hasPending: Bool { state.withLock { !$0.pending.isEmpty } }

    /// The records of an earlier daemon for `fileID`, per block, the newest first.
    public func pendingRecords(_ fileID: FileID) -> [Int64: [Record]] {
        state.withLock { $0.pending[fileID] ?? [:] }.mapValues { $0.sorted { $0.sequence > $1.sequence } }
    }

    /// The file was checked (and repaired if it needed it): its pending records are done.
    public func checked(_ fileID: FileID) { state.withLock { _ = $0.pending.removeValue(forKey: fileID) } }

    /// The blocks of `fileID` that have a record (a rewrite of them always needs one).
    public func recordedBlocks(_ fileID: FileID) -> Dictionary<Int64, Int>.Keys? { state.withLock { $0.recorded[fileID]?.keys } }

    /// Runs a recorded rewrite — `body` appends its records, then writes the slots —
    /// so that dropping records never meets it half done. Once the journal has grown
    /// past `trimThreshold`, a trim (a syncfs of the whole backing file system) is
    /// started on another thread: the request that found it grown does not wait for it.
    public func rewriting<R>(_ body: () throws -> R) rethrows -> R {
        let result = try rewrites.reading(body)
        if state.withLock({ $0.size > Self.trimThreshold }),
           !trimming.exchange(true, ordering: .acquiringAndReleasing) {
            DispatchQueue.global().async { [self] in
                defer { trimming.store(false, ordering: .releasing) }
                try? trim()
            }
        }
        return result
    }

    /// Writes records; with `durable`, they reach the disk before this returns, and
    /// they stay until the next trim; otherwise they go to the ring.
    public func append(_ records: [Record], durable: Bool) throws {
        guard !records.isEmpty else { return }
        var records = records
        let (numbered, file, offset) = state.withLock { state -> ([Record], Int32, Int64) in
            for i in records.indices {
                records[i].sequence = state.sequence
                state.sequence += 1
                state.count(records[i].fileID, records[i].block, +1)
            }
            if durable {
                defer { state.size += Int64(records.count * Self.recordSize) }
                return (records, state.file.rawValue, state.size)
            }
            if state.nextRingSlot + records.count > Self.ringSlots { state.nextRingSlot = 0 }
            for (i, record) in records.enumerated() {
                if let old = state.ring[state.nextRingSlot + i] { state.count(old.fileID, old.block, -1) }
                state.ring[state.nextRingSlot + i] = (record.fileID, record.block)
            }
            defer { state.nextRingSlot += records.count }
            return (records, state.file.rawValue, Int64(state.nextRingSlot * Self.recordSize))
        }
        records = numbered
        let bytes = records.flatMap(\.encoded)
        try bytes.withUnsafeBytes { try Sys.writeFully(file, $0, at: offset) }
        if durable { try Sys.fdatasync(file) }
    }

    /// After a trim that kept nothing (a clean exit), removes the journal file: no crash
    /// state is left to keep. True if it was removed.
    @discardableResult
    public func removeIfEmpty() -> Bool {
        state.withLock { state in
            guard state.pending.isEmpty, (try? Sys.stat(state.file.rawValue).st_size) == 0 else { return false }
            return (try? Sys.unlink(Self.fileName, in: directory.rawValue)) != nil
        }
    }

    /// Drops every record but those still pending (or all, after a check of every file
    /// in the vault): a syncfs first makes every rewrite done so far durable, so that no
    /// other record can be needed any more.
    public func trim(keepingPending: Bool = true) throws {
        try rewrites.writing {
            try Sys.syncFileSystem(data.rawValue)
            let kept = state.withLock { state -> [Record] in
                if !keepingPending { state.pending = [:] }
                return state.pending.values.flatMap { $0.values.joined() }
            }
            let bytes = [UInt8](repeating: 0, count: Self.ringSlots * Self.recordSize) + kept.flatMap(\.encoded)
            if !kept.isEmpty {
                // Written aside and renamed over, so that a crash keeps one whole copy.
                try AtomicFile.write(bytes, to: Self.fileName, in: directory.rawValue, mode: 0o600)
                var new = Optional(try Self.openFile(in: directory.rawValue, readOnly: false))
                // The old descriptor is closed as the new one replaces it.
                state.withLock { $0.file = new.take()! }
            } else {
                try Sys.truncate(state.withLock { $0.file.rawValue }, to: 0)
            }
            state.withLock { state in
                state.size = Int64(bytes.count)
                state.nextRingSlot = 0
                state.ring = [(fileID: FileID, block: Int64)?](repeating: nil, count: Self.ringSlots)
                state.recorded = state.pending.mapValues { $0.mapValues(\.count) }
            }
        }
    }
}
