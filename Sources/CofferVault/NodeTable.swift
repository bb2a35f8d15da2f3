// NodeTable maps the kernel's node IDs to backing inodes and counts lookups, so that a
// node lives exactly as long as the kernel may refer to it (until forget).
//
// Every node holds one O_PATH descriptor, so the kernel's inode cache must not grow past
// the descriptor limit: above `pressureThreshold` nodes the table asks (onPressure) for
// the least recently entered names to be invalidated in the kernel, which then forgets
// those inodes and the table shrinks again.
import Glibc

final class NodeTable: @unchecked Sendable {
    /// The kernel's fixed ID of the mount root (FUSE_ROOT_ID).
    static let rootID: UInt64 = 1

    let root: Node
    private let lock = Lock()
    private var byInode: [InodeKey: Node] = [:]
    /// Entering order: each remember() stamps the node with the next tick (LRU).
    private var tick: UInt64 = 0
    /// Nodes above which onPressure is called (set from the descriptor limit).
    var pressureThreshold = Int.max
    /// Called (outside the lock, at most once until `relieved()`) when the table is too big.
    var onPressure: (@Sendable () -> Void)?
    private var pressureReported = false

    struct InodeKey: Hashable {
        let dev: UInt64
        let ino: UInt64
    }

    init(root: Node) {
        self.root = root
        root.lookups = 1
    }

    /// The kernel's ID for `node`: the object's address (unique while it is alive).
    func id(of node: Node) -> UInt64 {
        node === root ? Self.rootID : UInt64(UInt(bitPattern: Unmanaged.passUnretained(node).toOpaque()))
    }

    /// The node for a kernel ID. The kernel only sends IDs it holds a lookup on, so the
    /// node is alive; the ID is its address.
    func node(_ id: UInt64) -> Node {
        if id == Self.rootID { return root }
        return Unmanaged<Node>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(id))!).takeUnretainedValue()
    }

    /// Registers one more kernel reference to the backing inode that `fd` (an O_PATH
    /// descriptor) names. Takes ownership of `fd`: it is closed if the inode is already known.
    func remember(fd: Int32, stat st: stat) -> Node {
        let key = InodeKey(dev: UInt64(st.st_dev), ino: UInt64(st.st_ino))
        var report = false
        let node: Node = lock.withLock {
            tick += 1
            if let known = byInode[key] {
                known.lookups += 1
                known.lastEntered = tick
                Sys.close(fd)
                return known
            }
            let node = Node(fd: fd, stat: st)
            node.lookups = 1
            node.lastEntered = tick
            byInode[key] = node
            if byInode.count > pressureThreshold && !pressureReported {
                pressureReported = true
                report = true
            }
            return node
        }
        if report { onPressure?() }
        return node
    }

    /// The relief asked for by onPressure is done: report pressure again when it returns.
    func relieved() { lock.withLock { pressureReported = false } }

    /// (parent, name) of the `count` least recently entered nodes with a known name.
    func coldestEntries(_ count: Int) -> [(parent: UInt64, name: [UInt8])] {
        let candidates = lock.withLock { byInode.values.map { ($0.lastEntered, $0) } }
        return candidates.sorted { $0.0 < $1.0 }.lazy.compactMap { _, node in
            node.entry.map { (self.id(of: $0.parent), $0.name) }
        }.prefix(count).map { $0 }
    }

    /// Drops `count` kernel references; the node is freed when none are left.
    func forget(_ id: UInt64, count: UInt64) {
        guard id != Self.rootID else { return }
        let node = node(id)
        lock.withLock {
            node.lookups -= min(count, node.lookups)
            if node.lookups == 0 { byInode[InodeKey(dev: node.dev, ino: node.ino)] = nil }
        }
    }

    /// Every node the kernel currently holds (for cache invalidation at lock time).
    func allIDs() -> [UInt64] {
        lock.withLock { byInode.values.map { id(of: $0) } } + [Self.rootID]
    }

    var count: Int { lock.withLock { byInode.count } }

    /// Every node, the root included.
    func allNodes() -> [Node] {
        lock.withLock { Array(byInode.values) } + [root]
    }

    /// Drops every plaintext name kept for damage reports (at lock time).
    func forgetNames() {
        lock.withLock { byInode.values.forEach { $0.forgetName() } }
    }
}
