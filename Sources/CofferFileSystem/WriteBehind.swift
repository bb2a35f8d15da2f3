// Starting the backing file's writeback behind a long run of sequential writes.
import CofferSystem
import CofferVault
import Dispatch
import Glibc
import Synchronization

/// Follows the writes of one open file and says when to start the disk on what a long
/// sequential run has written so far (sync_file_range with SYNC_FILE_RANGE_WRITE, which
/// waits for no page to be written; WriteBehindStarts makes the call). Without it the backing file's pages wait in the page cache until
/// the kernel's dirty limits or the writer's fsync, and a large copy ending in fsync
/// spends its last third with the CPUs idle while the disk catches up. Short files and
/// rewrites in place (databases, temporary files that are gone in a moment) are never
/// started early: only a run of `Self.runBeforeStart` sequential bytes is. The kernel may
/// write any page at any time anyway, so the format's safety does not depend on this.
/// Not thread-safe: the caller holds the node's content lock for writing.
struct WriteBehind {
    /// A run starts its writeback once it is this long (plaintext bytes)…
    static let runBeforeStart: Int64 = 8 << 20
    /// … and then each time it has grown by this much.
    static let step: Int64 = 4 << 20

    /// Where the current run's next write would start (-1: no run yet).
    private var next: Int64 = -1
    /// Where the current run started.
    private var runStart: Int64 = 0
    /// Plaintext offset up to which writeback has been started.
    private var started: Int64 = 0

    /// Records a write of `count` bytes at `offset`; returns the plaintext range whose
    /// backing bytes should now start to be written out, if any.
    mutating func wrote(_ count: Int, at offset: Int64) -> Range<Int64>? {
        if offset != next {
            runStart = offset
            started = offset
        }
        next = offset + Int64(count)
        guard next - runStart >= Self.runBeforeStart, next - started >= Self.step else { return nil }
        defer { started = next }
        return started..<next
    }

    /// The backing file's bytes that hold plaintext range `range`'s whole blocks (the
    /// last block, which the next write may still complete, is left for later), in
    /// whole pages.
    static func backingRange(of range: Range<Int64>, layout: BlockLayout) -> (offset: Int64, length: Int64)? {
        let first = layout.cipherOffset(block: BlockLayout.blockIndex(plainOffset: range.lowerBound))
        let end = layout.cipherOffset(block: BlockLayout.blockIndex(plainOffset: range.upperBound))
        let page: Int64 = 4096
        let start = first / page * page, stop = end / page * page
        return stop > start ? (start, stop - start) : nil
    }
}

/// Starts the writeback WriteBehind asks for on a thread of its own (`coffer-wbehind`,
/// started at the first), so that a write request never waits for the disk's queue: on
/// a slow disk whose queue is full, `sync_file_range` blocks until there is room, which
/// would hold the writer up long before the kernel's dirty limits would. The thread
/// opens the file afresh, read-only, through its node: a duplicate of the writer's
/// descriptor would keep the open file alive past the writer's close, and delay the
/// IN_CLOSE_WRITE that a sync engine waits for (a file its owner may not read, opened by
/// a daemon that is not root, is left to the kernel). Ranges of one file that follow one
/// another are merged while they wait.
final class WriteBehindStarts: Sendable {
    private struct Waiting {
        var ranges: [(node: Node, offset: Int64, length: Int64)] = []
        var threadStarted = false
        var stopped = false
    }
    private let waiting = Mutex(Waiting())
    /// Signalled once per range queued (a merged one too), and at stop.
    private let ready = DispatchSemaphore(value: 0)

    init() {}

    /// Queues the backing bytes `offset..<offset+length` of `node` to be started.
    func start(_ node: Node, offset: Int64, length: Int64) {
        let startThread: Bool? = waiting.withLock { waiting in
            guard !waiting.stopped else { return nil }
            if let last = waiting.ranges.last, last.node === node, last.offset + last.length == offset {
                waiting.ranges[waiting.ranges.count - 1].length += length
            } else {
                waiting.ranges.append((node, offset, length))
            }
            defer { waiting.threadStarted = true }
            return !waiting.threadStarted
        }
        guard let startThread else { return }
        if startThread { BackgroundThread.start("coffer-wbehind") { [self] in run() } }
        ready.signal()
    }

    /// Drops what waits and ends the thread (at unmount: the daemon's closing sync writes
    /// everything anyway).
    func stop() {
        waiting.withLock { waiting in
            waiting.stopped = true
            waiting.ranges = []
        }
        ready.signal()
    }

    private func run() {
        while true {
            ready.wait()
            let next: (node: Node, offset: Int64, length: Int64)?? = waiting.withLock { waiting in
                if waiting.stopped { return nil }
                return waiting.ranges.isEmpty ? .some(nil) : waiting.ranges.removeFirst()
            }
            guard let next else { return }
            // A signal whose range was merged into one already taken finds nothing.
            guard let (node, offset, length) = next,
                  let fd = try? FileDescriptor.open(node.procPath, flags: O_RDONLY) else { continue }
            try? Sys.startWriteOut(fd.rawValue, offset: offset, length: length)
        }
    }
}
