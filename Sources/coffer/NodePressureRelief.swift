// NodePressureRelief keeps the daemon's node table (one O_PATH descriptor per inode the
// kernel caches) below the descriptor limit: when the table passes its threshold, a
// background thread invalidates the least recently entered names in the kernel, which
// drops those dentries and inodes and sends forget for them.
import CofferFUSE
import CofferFileSystem
import Foundation
import Logging

enum NodePressureRelief {
    static func start(fs: PlainFileSystem, session: FuseSession, logger: Logger) {
        let wake = DispatchSemaphore(value: 0)
        fs.onNodePressure { wake.signal() }
        let threshold = fs.nodePressureThreshold
        let thread = Thread {
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
