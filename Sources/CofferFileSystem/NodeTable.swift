// NodeTable maps the kernel's node IDs to backing inodes and counts lookups, so that a
// node lives exactly as long as the kernel may refer to it (until forget).
//
// Every node holds one O_PATH descriptor, so the kernel's inode cache must not grow past
// the descriptor limit: above `pressureThreshold` nodes the table asks (`onPressure`) for
// the least recently entered names to be invalidated in the kernel, which then forgets
// those inodes and the table shrinks again.
import CofferCrypto
import CofferSystem
import Glibc
import Synchronization

final class NodeTable: Sendable {
    /// The kernel's fixed ID of the mount root (FUSE_ROOT_ID).
    static let rootID: UInt64 = 1

    let root: Node
    /// Nodes above which `onPressure` is called (set from the descriptor limit).
    let pressureThreshold: Int
    /// Called with the table (outside the lock, at most once until `relieved()`) when it
    /// is too big, from the request thread that made it so.
    private let onPressure: @Sendable (NodeTable) -> Void
    /// The table, the lookup counts and the pressure state. Lock order: see
    /// PlainFileSystem's `gate`; only a Node's own state is taken under this lock.
    private let table: Mutex<Table>

    struct InodeKey: Hashable {
        let dev: UInt64
        let ino: UInt64
    }

    private struct Known: Sendable {
        let node: Node
        /// Kernel lookup count.
        var lookups: UInt64
        /// When the node was last entered (LRU tick).
        var lastEntered: UInt64
    }

    private struct Table: Sendable {
        var byInode: [InodeKey: Known] = [:]
        /// Entering order: each remember() stamps the node with the next tick (LRU).
        var tick: UInt64 = 0
        var pressureReported = false

        /// One more kernel reference to the known node of `key` (stamped as just
        /// entered), or nil if the table holds none.
        mutating func enterAgain(_ key: InodeKey) -> Node? {
            guard var known = byInode[key] else { return nil }
            tick += 1
            known.lookups += 1
            known.lastEntered = tick
            byInode[key] = known
            return known.node
        }
    }

    init(root: Node, pressureThreshold: Int = .max, onPressure: @escaping @Sendable (NodeTable) -> Void = { _ in }) {
        self.root = root
        self.pressureThreshold = pressureThreshold
        self.onPressure = onPressure
        table = Mutex(Table())
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

    /// The kernel's lookup count of node `id` (the root's is always 1).
    func lookups(_ id: UInt64) -> UInt64 {
        if id == Self.rootID { return 1 }
        let node = node(id)
        return table.withLock { table in
            guard let known = table.byInode[InodeKey(dev: node.dev, ino: node.ino)], known.node === node else { return 0 }
            return known.lookups
        }
    }

    /// The node of backing inode `st`, if the kernel holds one.
    func known(_ st: stat) -> Node? {
        let key = InodeKey(dev: UInt64(st.st_dev), ino: UInt64(st.st_ino))
        return table.withLock { $0.byInode[key]?.node }
    }

    /// Registers one more kernel reference to `node` if the table still holds it (a new
    /// name of it: a hard link); false if it does not.
    func rememberAgain(_ node: Node) -> Bool {
        let key = InodeKey(dev: node.dev, ino: node.ino)
        return table.withLock { table in
            table.byInode[key]?.node === node && table.enterAgain(key) != nil
        }
    }

    /// Registers one more kernel reference to the backing inode that `fd` (an O_PATH
    /// descriptor) names. Takes ownership of `fd`: it is closed if the inode is already
    /// known. `isNew`: the node was made by this call.
    func remember(fd: consuming FileDescriptor, stat st: stat) -> (node: Node, isNew: Bool) {
        // Taken by a new node; closed when this returns if the inode is already known.
        var pending: FileDescriptor? = consume fd
        let key = InodeKey(dev: UInt64(st.st_dev), ino: UInt64(st.st_ino))
        let threshold = pressureThreshold
        let (node, isNew, pressed): (Node, Bool, Bool) = table.withLock { table in
            if let known = table.enterAgain(key) { return (known, false, false) }
            table.tick += 1
            let node = Node(fd: pending.take()!, stat: st)
            table.byInode[key] = Known(node: node, lookups: 1, lastEntered: table.tick)
            if table.byInode.count > threshold && !table.pressureReported {
                table.pressureReported = true
                return (node, true, true)
            }
            return (node, true, false)
        }
        if pressed { onPressure(self) }
        return (node, isNew)
    }

    /// The relief asked for by `onPressure` is done: report pressure again when it returns.
    func relieved() { table.withLock { $0.pressureReported = false } }

    /// (parent, name) of the `count` least recently entered nodes with a known name.
    func coldestEntries(_ count: Int) -> [(parent: UInt64, name: [UInt8])] {
        let candidates = table.withLock { $0.byInode.values.map { ($0.lastEntered, $0.node) } }
        return candidates.sorted { $0.0 < $1.0 }.lazy.compactMap { _, node in
            node.entry.map { (self.id(of: $0.parent), $0.name) }
        }.prefix(count).map { $0 }
    }

    /// Drops `count` kernel references; the node is freed when none are left, and then
    /// returned (for what must end with it) — alive until the caller lets go.
    @discardableResult
    func forget(_ id: UInt64, count: UInt64) -> Node? {
        guard id != Self.rootID else { return nil }
        let node = node(id)
        let key = InodeKey(dev: node.dev, ino: node.ino)
        return table.withLock { table -> Node? in
            guard var known = table.byInode[key], known.node === node else { return nil }
            known.lookups -= min(count, known.lookups)
            table.byInode[key] = known.lookups == 0 ? nil : known
            return known.lookups == 0 ? node : nil
        }
    }

    /// Every node the kernel currently holds (for cache invalidation at lock time).
    func allIDs() -> [UInt64] {
        table.withLock { $0.byInode.values.map { id(of: $0.node) } } + [Self.rootID]
    }

    var count: Int { table.withLock { $0.byInode.count } }

    /// Every node, the root included.
    func allNodes() -> [Node] {
        table.withLock { $0.byInode.values.map(\.node) } + [root]
    }

    /// Drops every plaintext name kept for damage reports (at lock time).
    /// `keeping`: a key domain whose nodes keep their names (the after-first-unlock
    /// domain's, through a lock that keeps its keys).
    func forgetNames(keeping kept: KeyDomain? = nil) {
        table.withLock { $0.byInode.values.forEach { if $0.node.keyDomain != kept { $0.node.forgetName() } } }
    }
}
