// NodeTable maps the kernel's node IDs to backing inodes and counts lookups, so that a
// node lives exactly as long as the kernel may refer to it (until forget).
import Glibc

final class NodeTable: @unchecked Sendable {
    /// The kernel's fixed ID of the mount root (FUSE_ROOT_ID).
    static let rootID: UInt64 = 1

    let root: Node
    private let lock = Lock()
    private var byInode: [InodeKey: Node] = [:]

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
        return lock.withLock {
            if let known = byInode[key] {
                known.lookups += 1
                Sys.close(fd)
                return known
            }
            let node = Node(fd: fd, stat: st)
            node.lookups = 1
            byInode[key] = node
            return node
        }
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

    func allEntries() -> [(parent: UInt64, name: [UInt8])] {
        lock.withLock { byInode.values.compactMap { node in node.entry.map { (id(of: $0.parent), $0.name) } } }
    }

    /// Drops every plaintext name kept for damage reports (at lock time).
    func forgetNames() {
        lock.withLock { byInode.values.forEach { $0.forgetName() } }
    }
}
