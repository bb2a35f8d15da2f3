// NodePressureRelief keeps the daemon's node table (one O_PATH descriptor per inode the
// kernel caches) below the descriptor limit: when the table passes its threshold, a
// background thread invalidates the least recently entered names in the kernel, which
// drops those dentries and inodes and sends forget for them.
import CofferFUSE
import CofferFileSystem
import Foundation
import Logging

final class NodePressureRelief: Sendable {
    private let wake = DispatchSemaphore(value: 0)

    /// The file system's node-pressure hook: wakes the relief thread (it may be called
    /// before the thread runs; the wake-up waits for it).
    func pressed() { wake.signal() }

    /// Starts the thread that relieves `fs`'s pressure through `session`.
    func start(fs: PlainFileSystem, session: FuseSession, logger: Logger) {
        let threshold = fs.nodePressureThreshold
        let thread = Thread { [wake] in
            while true {
                wake.wait()
                // Invalidate down to three quarters of the threshold; the kernel's forgets
                // arrive asynchronously and shrink the table.
                let excess = fs.nodeCount - threshold * 3 / 4
                if excess > 0 {
                    for entry in fs.coldestEntries(excess) { session.invalidate(parent: entry.parent, name: entry.name) }
                }
                // Give the forgets a moment before pressure may be reported again.
                usleep(50_000)
                fs.relievedNodePressure()
            }
        }
        thread.name = "coffer-node-relief"
        thread.start()
        logger.info("node table: relief above \(threshold) cached inodes")
    }
}
