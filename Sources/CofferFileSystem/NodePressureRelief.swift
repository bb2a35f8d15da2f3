// NodePressureRelief keeps the node table (one O_PATH descriptor per inode the kernel
// caches) below the descriptor limit: when the table passes its threshold, the least
// recently entered names are invalidated in the kernel, off the request thread, which
// drops those dentries and inodes and sends forget for them.
import Dispatch
import Glibc

struct NodePressureRelief: Sendable {
    /// The file system's hook that drops a name from the kernel's caches.
    let invalidateEntry: @Sendable (UInt64, UnsafeBufferPointer<UInt8>) -> Void

    /// The table's pressure call (from the request thread that made it too big; at most
    /// once until `relieved()`): the work goes to another thread, since the kernel may
    /// hold the directory lock of that request.
    func relieve(_ table: NodeTable) {
        DispatchQueue.global().async { [invalidateEntry] in
            // Invalidate down to three quarters of the threshold; the kernel's forgets
            // arrive asynchronously and shrink the table.
            let excess = table.count - table.pressureThreshold * 3 / 4
            if excess > 0 {
                for entry in table.coldestEntries(excess) {
                    entry.name.withUnsafeBufferPointer { invalidateEntry(entry.parent, $0) }
                }
            }
            // Give the forgets a moment before pressure may be reported again.
            usleep(50_000)
            table.relieved()
        }
    }
}
