// PlaceTagWrites writes a renamed file's new place tag into its header after the
// rename has been answered (docs/FORMAT.md §4; issue 35). The place xattr,
// which holds the old and the new tag and which a power cut keeps together with the
// rename (both are the inode's metadata), is written before the answer: a file whose
// header still has the old tag opens by the xattr, as after a power cut. The header's
// 16 bytes, the times put back and the descriptor's close then leave the reply path.
//
// The rules that keep that safe:
// - an inode's writes run in the order they were queued;
// - whatever reads or changes an inode's header, content or times first waits for that
//   inode's pending writes (`settle`): open, every operation through an open file
//   (PlainFileSystem.withContentKey), setattr, the next rename or link of it; so a
//   write after the rename never has its time put back by a tag write queued before it;
// - fsync waits for the inode's, the lock and the daemon's clean exit for all
//   (`settleAll`): nothing is left queued where the keys or the mount are gone;
// - at most `limit` writes wait; the rename that would exceed it writes its own tag
//   before its reply, as every rename did before.
// A write is done on a background queue as soon as it can; each holds a descriptor of
// its file (a `dup` of the one the rename opened), closed once written.
import CofferSystem
import CofferVault
import Dispatch
import Glibc
import Logging
import Synchronization

final class PlaceTagWrites: Sendable {
    /// The most writes waiting at once (each holds a descriptor).
    static let limit = 256

    /// One queued write: `tag` into the header of `fd`, then `times` back.
    private struct Write: Sendable {
        let fd: Int32
        let tag: [UInt8]
        let times: [timespec]
    }

    private struct State {
        /// Pending writes by backing inode, each inode's in order.
        var pending: [UInt64: [Write]] = [:]
        /// Inodes whose writes a thread is running now, and what its end is signalled by.
        var running: [UInt64: DispatchGroup] = [:]
        var count = 0
        /// The worker is asked to run (once for a burst of renames, not once per rename:
        /// each wake-up of a thread costs more than the write it does).
        var scheduled = false
    }

    private let state = Mutex(State())
    /// Writes queued and not yet done: the one thing every request reads, to skip the
    /// lock when nothing waits (the common case). A write is counted before the rename's
    /// reply, so any request the kernel sends after that reply sees it.
    private let waiting = Atomic<Int>(0)
    private let worker = DispatchQueue(label: "coffer.place-tags", qos: .utility)
    /// While true the queue writes nothing by itself: only the settle points do (for
    /// tests: a full queue, a power cut with every tag still queued). The daemon starts
    /// held where the environment has COFFER_HOLD_PLACE_TAGS=1.
    private let held: Atomic<Bool>
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
        held = Atomic(getenv("COFFER_HOLD_PLACE_TAGS").map { String(cString: $0) } == "1")
    }

    /// Holds or lets go the queue's own writing (see `held`); letting go writes what waits.
    package func hold(_ hold: Bool) {
        held.store(hold, ordering: .releasing)
        if !hold { worker.async { [self] in settleAll() } }
    }

    /// Writes `tag` into the header of backing file `fd` (of inode `inode`) and puts its
    /// atime and mtime back to `times`, soon, on the queue; `fd` is the queue's from now
    /// on, closed once written. With `limit` writes waiting, it is written here and now.
    func write(_ tag: [UInt8], to fd: Int32, inode: UInt64, keeping times: [timespec]) {
        let write = Write(fd: fd, tag: tag, times: times)
        enum Queued { case no, yes, andWake }
        let queued = state.withLock { state -> Queued in
            guard state.count < Self.limit else { return .no }
            state.pending[inode, default: []].append(write)
            state.count += 1
            // Counted under the lock, so that the worker, which stops under it once it
            // finds nothing pending, cannot miss this one.
            waiting.add(1, ordering: .releasing)
            if state.scheduled { return .yes }
            state.scheduled = true
            return .andWake
        }
        switch queued {
        case .no:
            settle(inode)
            perform(write, inode: inode)
        case .yes:
            break
        case .andWake:
            worker.async { [self] in drain() }
        }
    }

    /// The worker: writes what is pending, inode by inode, until nothing is (then the
    /// next write wakes it again); while held, nothing.
    private func drain() {
        while !held.load(ordering: .acquiring) {
            let next = state.withLock { state -> UInt64? in
                guard let inode = state.pending.keys.first else {
                    state.scheduled = false
                    return nil
                }
                return inode
            }
            guard let next else { return }
            settle(next)
        }
        state.withLock { $0.scheduled = false }
    }

    /// Runs `inode`'s pending writes here, after those another thread is running now.
    func settle(_ inode: UInt64) {
        guard waiting.load(ordering: .acquiring) > 0 else { return }
        while true {
            enum Next { case wait(DispatchGroup), run([Write], DispatchGroup), done }
            let next = state.withLock { state -> Next in
                if let running = state.running[inode] { return .wait(running) }
                guard let writes = state.pending.removeValue(forKey: inode) else { return .done }
                let group = DispatchGroup()
                group.enter()
                state.running[inode] = group
                return .run(writes, group)
            }
            switch next {
            case .done:
                return
            case .wait(let group):
                group.wait()
            case .run(let writes, let group):
                writes.forEach { perform($0, inode: inode) }
                state.withLock { state in
                    state.running[inode] = nil
                    state.count -= writes.count
                }
                waiting.subtract(writes.count, ordering: .releasing)
                group.leave()
            }
        }
    }

    /// Runs or waits for every pending write.
    func settleAll() {
        while waiting.load(ordering: .acquiring) > 0 {
            let inodes = state.withLock { Array($0.pending.keys) + Array($0.running.keys) }
            if inodes.isEmpty { return }
            inodes.forEach(settle)
        }
    }

    private func perform(_ write: Write, inode: UInt64) {
        defer { Sys.close(write.fd) }
        do {
            try ContentFile.writePlaceTag(write.tag, to: write.fd, keeping: write.times)
        } catch {
            // The place xattr holds the new tag too: the file opens by it.
            logger.warning("place tag not written into the header of a renamed file (backing inode \(inode)): \(error); its place xattr stands for it")
        }
    }
}
