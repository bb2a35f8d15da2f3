// ReverseFileSystem serves a reverse view (docs/FORMAT.md §14): the format-7 vault of a
// plaintext directory, read-only, computed on demand by ReverseFormat. FUSE-shaped (node
// ids, lookup counts) but importing no FUSE. A node holds its entry's path from PLAINDIR
// and inode, and holds no descriptor (a backup's tree may have more entries than the
// process may have descriptors): each operation opens it anew below PLAINDIR, following no
// symlink (openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), and answers ESTALE where
// another inode now stands. The IV files, the config and the long names' sidecars are
// nodes of their own whose bytes are computed.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc
import Logging
import Synchronization

public final class ReverseFileSystem: Sendable {
    /// A node the kernel may now name, with its attributes.
    public struct Entry: Sendable {
        public let node: UInt64
        public let attributes: stat
    }

    /// An entry of a listing: its name in the view, inode number and type.
    public struct Listed: Sendable {
        public let name: String
        public let ino: UInt64
        /// d_type (DT_REG, DT_DIR, …).
        public let type: UInt8
        /// "." or "..": listed, never entered.
        public var isDotOrDotDot: Bool { name == "." || name == ".." }
    }

    /// How long the kernel may keep names and attributes: PLAINDIR changes under the view
    /// at any time, with no one to tell the kernel.
    public static let cacheSeconds = 1.0
    /// The root's node ID (FUSE_ROOT_ID).
    static let rootID: UInt64 = 1
    /// Inode numbers of the view's own files (IV files, the config, sidecars): above every
    /// number a plaintext file system gives.
    static let ownInodes: UInt64 = 1 << 63

    public let logger: Logger
    private let format: ReverseFormat
    private let excludes: ReverseExcludes
    /// The config's bytes and attributes, served as the root's `coffer.conf`; the view's
    /// own files take its owner and times, which stay as long as the config does.
    private let config: [UInt8]
    private let configStat: stat
    /// PLAINDIR, below which every entry is opened.
    private let rootDirectory: FileDescriptor
    /// PLAINDIR's file system: a directory on another is shown empty.
    private let device: dev_t
    private let nodes: Mutex<ReverseNodeIndex>
    private let handles = Mutex<[UInt64: ReverseHandle]>([:])
    private let nextHandle = Atomic<UInt64>(1)

    /// Serves `plaindir` (opened with its config as `source`) with `format`'s keys, leaving
    /// out what `excludes` names.
    public init(source: Vault, format: ReverseFormat, excludes: ReverseExcludes, logger: Logger) throws {
        self.format = format
        self.excludes = excludes
        self.logger = logger
        rootDirectory = try source.root.reopenDirectory(flags: O_RDONLY)
        config = try Sys.readFile(ReverseFormat.configName, in: source.root.rawValue, limit: 64 << 10)
        // The bytes served are the config the keys came from, not one put in its place since.
        guard (try? VaultConfig.parse(config)) == source.config else {
            throw VaultError.configMalformed(reason: "\(ReverseFormat.configName) changed while the view was being mounted")
        }
        configStat = try Sys.stat(ReverseFormat.configName, in: source.root.rawValue)
        let st = try Sys.stat(rootDirectory.rawValue)
        let iv = try format.reverse.rootIV()
        device = st.st_dev
        let root = Node(id: Self.rootID, key: nil, kind: .directory(iv: iv, foreign: false), parent: nil, name: [], path: [],
                        ino: UInt64(st.st_ino), device: st.st_dev)
        nodes = Mutex(ReverseNodeIndex(root: root))
    }

    // MARK: Nodes

    /// LOOKUP of `name` (a name of the view) in directory node `parent`.
    public func lookup(parent: UInt64, name: String) throws -> Entry {
        let dir = try node(parent)
        guard case .directory(let iv, let foreign) = dir.kind else { throw Errno(ENOTDIR) }
        if name == DirectoryIV.fileName {
            let content = try format.ivFile(iv: iv, parentIV: dir.parent.map(\.iv) ?? [], name: dir.name)
            return try enterOwn(.own(of: dir.id, name: name), content: content, in: dir)
        }
        guard !foreign else { throw Errno(ENOENT) }
        if dir.id == Self.rootID && name == VaultConfig.fileName {
            return try enterOwn(.own(of: dir.id, name: name), content: config, in: dir)
        }
        if name.hasPrefix(NameTransform.longNamePrefix) && name.hasSuffix(NameTransform.sidecarSuffix) {
            let hashed = String(name.dropLast(NameTransform.sidecarSuffix.count))
            guard let plain = try longName(hashed, in: dir), case .long(_, let encoded) = try format.backingName(plain, dirIV: iv) else {
                throw Errno(ENOENT)
            }
            return try enterOwn(.own(of: dir.id, name: name), content: Array(encoded.utf8), in: dir)
        }
        let plain: [UInt8]
        if name.hasPrefix(NameTransform.longNamePrefix) {
            guard let found = try longName(name, in: dir) else { throw Errno(ENOENT) }
            plain = found
        } else {
            guard let found = format.plaintextName(ofShort: name, dirIV: iv) else { throw Errno(ENOENT) }
            plain = found
        }
        guard isShown(plain, in: dir) else { throw Errno(ENOENT) }
        return try lookup(plain, in: dir)
    }

    /// The entry of plaintext name `plain` in directory node `dir`.
    private func lookup(_ plain: [UInt8], in dir: Node) throws -> Entry {
        let st = try withEntry(dir, flags: O_PATH | O_DIRECTORY) { parent, _ in try Sys.stat(bytes: plain, in: parent) }
        if st.st_mode & S_IFMT == S_IFLNK && Int(st.st_size) > ReverseFormat.maxTargetLength {
            throw Errno(ENOENT)  // left out of the view (listing logs it)
        }
        let key: ReverseNodeKey = st.st_mode & S_IFMT == S_IFREG && st.st_nlink > 1 ? .inode(UInt64(st.st_ino))
            : .entry(of: dir.id, name: plain)
        let node = try enter(key, ino: UInt64(st.st_ino), make: { id, key in
            let kind: Node.Kind
            if st.st_mode & S_IFMT == S_IFDIR {
                kind = .directory(iv: try self.format.reverse.directoryIV(parentIV: dir.iv, name: plain),
                                  foreign: st.st_dev != self.device)
            } else {
                kind = .plain
            }
            return Node(id: id, key: key, kind: kind, parent: dir, name: plain, path: dir.path.isEmpty ? plain : dir.path + [0x2f] + plain,
                        ino: UInt64(st.st_ino), device: st.st_dev)
        })
        // The attributes from the stat just made, not from a second one.
        return Entry(node: node.id, attributes: viewed(st, of: node))
    }

    /// The node of a file of the view's own, `content` its bytes, in directory node `dir`.
    private func enterOwn(_ key: ReverseNodeKey, content: [UInt8], in dir: Node) throws -> Entry {
        let node = try enter(key, make: { Node(own: $0, key: $1, content: content, parent: dir) })
        return Entry(node: node.id, attributes: try attributes(of: node))
    }

    /// The node for `key`: the one there if it is still the same inode (then one more
    /// lookup), else a new one `make` builds with a new ID.
    private func enter(_ key: ReverseNodeKey, ino: UInt64? = nil, make: (UInt64, ReverseNodeKey) throws -> Node) throws -> Node {
        try nodes.withLock { index in
            if let id = index.byKey[key], let known = index.byID[id], ino == nil || known.ino == ino {
                known.lookups.add(1, ordering: .relaxed)
                return known
            }
            let made = try make(index.nextID, key)
            index.nextID += 1
            index.byID[made.id] = made
            index.byKey[key] = made.id
            made.lookups.store(1, ordering: .relaxed)
            return made
        }
    }

    /// FORGET: the kernel dropped `count` lookups of `id`.
    public func forget(_ id: UInt64, count: UInt64) {
        guard id != Self.rootID else { return }
        nodes.withLock { index in
            guard let node = index.byID[id] else { return }
            if node.lookups.subtract(count, ordering: .relaxed).newValue == 0 {
                index.byID[id] = nil
                if let key = node.key, index.byKey[key] == id { index.byKey[key] = nil }
            }
        }
    }

    private func node(_ id: UInt64) throws -> Node {
        guard let node = nodes.withLock({ $0.byID[id] }) else { throw Errno(ESTALE) }
        return node
    }

    /// The plaintext entry of `node` opened with `flags` (and O_NOFOLLOW) below PLAINDIR,
    /// following no symlink, with its attributes; ESTALE if another inode stands there now.
    private func withEntry<R>(_ node: Node, flags: Int32, _ body: (Int32, stat) throws -> R) throws -> R {
        let fd = try Sys.open(beneath: rootDirectory.rawValue, path: node.path, flags: flags)
        let st = try Sys.stat(fd.rawValue)
        guard UInt64(st.st_ino) == node.ino && st.st_dev == node.device else { throw Errno(ESTALE) }
        return try body(fd.rawValue, st)
    }

    // MARK: Attributes

    /// GETATTR.
    public func getattr(_ id: UInt64) throws -> stat { try attributes(of: try node(id)) }

    private func attributes(of node: Node) throws -> stat {
        if let content = node.content {
            var st = configStat
            st.st_ino = __ino_t(Self.ownInodes | node.id)
            st.st_mode = S_IFREG | 0o400
            st.st_nlink = 1
            st.st_size = Int(content.count)
            st.st_blocks = (st.st_size + 511) / 512
            return st
        }
        return viewed(try withEntry(node, flags: O_PATH) { $1 }, of: node)
    }

    /// The view's attributes of `node` whose plaintext entry has attributes `st`.
    private func viewed(_ st: stat, of node: Node) -> stat {
        var st = st
        switch st.st_mode & S_IFMT {
        case S_IFREG: st.st_size = Int(ReverseFormat.cipherSize(plainSize: Int64(st.st_size)))
        case S_IFLNK: st.st_size = Int(ReverseFormat.symlinkSize(targetLength: Int(st.st_size)))
        case S_IFDIR: if case .directory(_, true) = node.kind { st.st_nlink = 2 }
        default: break
        }
        st.st_blocks = (st.st_size + 511) / 512
        return st
    }

    /// STATFS: PLAINDIR's file system.
    public func statfs() throws -> statvfs {
        var st = try Sys.statvfs(rootDirectory.rawValue)
        st.f_namemax = UInt(NameTransform.maxNameLength)
        return st
    }

    /// READLINK: the view's target of a symlink.
    public func readlink(_ id: UInt64) throws -> String {
        let node = try node(id)
        guard let dir = node.parent else { throw Errno(EINVAL) }
        var (target, st) = try withEntry(node, flags: O_PATH) { fd, st in
            guard st.st_mode & S_IFMT == S_IFLNK else { throw Errno(EINVAL) }
            return (try Sys.readlink(bytes: [], in: fd), st)
        }
        defer { target.zeroInPlace() }
        let id = try format.entryID(dirIV: dir.iv, name: node.name, links: UInt64(st.st_nlink), inode: UInt64(st.st_ino))
        guard let stored = try format.symlinkTarget(target, id: id) else { throw Errno(ENAMETOOLONG) }
        return stored
    }

    // MARK: Files

    /// OPEN of a file of the view (read-only: the mount is).
    public func open(_ id: UInt64) throws -> UInt64 {
        let node = try node(id)
        let handle: ReverseHandle
        if let content = node.content {
            handle = .own(content)
        } else {
            guard let dir = node.parent else { throw Errno(EISDIR) }
            // O_NONBLOCK: a FIFO put in the file's place would wait for a writer.
            handle = try withEntry(node, flags: O_RDONLY | O_NONBLOCK) { fd, st in
                guard st.st_mode & S_IFMT == S_IFREG else { throw Errno(EINVAL) }
                let links = UInt64(st.st_nlink), inode = UInt64(st.st_ino)
                let fileID = try format.entryID(dirIV: dir.iv, name: node.name, links: links, inode: inode)
                let header = try format.header(id: fileID, dirIV: dir.iv, name: node.name, links: links)
                // The handle keeps its own descriptor, closed at RELEASE.
                let kept = dup(fd)
                guard kept >= 0 else { throw Errno.current("dup") }
                return .file(ReverseFormat.OpenFile(plain: kept, plainSize: Int64(st.st_size), id: fileID, header: header))
            }
        }
        let number = nextHandle.add(1, ordering: .relaxed).oldValue
        handles.withLock { $0[number] = handle }
        return number
    }

    /// READ of the view's bytes.
    public func read(_ handle: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        guard let open = handles.withLock({ $0[handle] }) else { throw Errno(EBADF) }
        switch open {
        case .file(let file):
            return try format.read(file, at: offset, into: buffer)
        case .own(let content):
            guard offset < content.count else { return 0 }
            let n = min(buffer.count, content.count - Int(offset))
            content.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + Int(offset), byteCount: n) }
            return n
        case .listing:
            throw Errno(EISDIR)
        }
    }

    /// RELEASE and RELEASEDIR.
    public func release(_ handle: UInt64) {
        if case .file(let file) = handles.withLock({ $0.removeValue(forKey: handle) }) { Sys.close(file.plain) }
    }

    // MARK: Directories

    /// OPENDIR: the listing is taken now.
    public func opendir(_ id: UInt64) throws -> UInt64 {
        let dir = try node(id)
        guard case .directory(let iv, let foreign) = dir.kind else { throw Errno(ENOTDIR) }
        var listed = [Listed(name: ".", ino: dir.ino, type: UInt8(DT_DIR)), Listed(name: "..", ino: dir.parent?.ino ?? dir.ino, type: UInt8(DT_DIR))]
        listed.append(Listed(name: DirectoryIV.fileName, ino: Self.ownInodes, type: UInt8(DT_REG)))
        if !foreign {
            if dir.id == Self.rootID { listed.append(Listed(name: VaultConfig.fileName, ino: Self.ownInodes, type: UInt8(DT_REG))) }
            var longNames: [String: [UInt8]] = [:]
            try withEntry(dir, flags: O_RDONLY | O_DIRECTORY) { fd, _ in
                for entry in try Sys.readDirectoryBytes(fd) where isShown(entry.name, in: dir) {
                    var type = entry.type
                    if type == UInt8(DT_UNKNOWN) || type == UInt8(DT_LNK) {
                        guard let st = try? Sys.stat(bytes: entry.name, in: fd) else { continue }
                        type = UInt8((st.st_mode & S_IFMT) >> 12)
                        if st.st_mode & S_IFMT == S_IFLNK && Int(st.st_size) > ReverseFormat.maxTargetLength {
                            // Named by its name in the view: the log holds no plaintext name.
                            let shown = (try? format.backingName(entry.name, dirIV: iv).name) ?? "?"
                            logger.warning("""
                                reverse view: the symlink \(shown) has a target of \(st.st_size) bytes, more than the \
                                \(ReverseFormat.maxTargetLength) a view serves: left out
                                """)
                            continue
                        }
                    }
                    switch try format.backingName(entry.name, dirIV: iv) {
                    case .short(let name), .conflictCopy(let name):
                        listed.append(Listed(name: name, ino: entry.ino, type: type))
                    case .long(let hashed, _):
                        longNames[hashed] = entry.name
                        listed.append(Listed(name: hashed, ino: entry.ino, type: type))
                        listed.append(Listed(name: hashed + NameTransform.sidecarSuffix, ino: Self.ownInodes, type: UInt8(DT_REG)))
                    }
                }
            }
            dir.longNames.withLock { $0 = longNames }
        }
        let number = nextHandle.add(1, ordering: .relaxed).oldValue
        handles.withLock { $0[number] = .listing(listed) }
        return number
    }

    /// READDIR: the listing's entries from `offset`.
    public func readdir(_ handle: UInt64, from offset: Int) throws -> ArraySlice<Listed> {
        guard case .listing(let listed) = handles.withLock({ $0[handle] }) else { throw Errno(EBADF) }
        return listed[min(offset, listed.count)...]
    }

    // MARK: Names

    /// Whether `plain`, an entry of directory node `dir`, is in the view: not the config,
    /// not excluded.
    private func isShown(_ plain: [UInt8], in dir: Node) -> Bool {
        if dir.id == Self.rootID && plain == Array(ReverseFormat.configName.utf8) { return false }
        return !excludes.excludes(path: dir.path.isEmpty ? plain : dir.path + [0x2f] + plain, name: plain)
    }

    /// The plaintext name whose long name is `hashed` in directory node `dir`: from the
    /// names its last listing found, else from a listing now.
    private func longName(_ hashed: String, in dir: Node) throws -> [UInt8]? {
        if let known = dir.longNames.withLock({ $0[hashed] }) { return known }
        guard case .directory(let iv, _) = dir.kind else { return nil }
        let found = try withEntry(dir, flags: O_RDONLY | O_DIRECTORY) { fd, _ in
            try Sys.readDirectoryBytes(fd).first { entry in
                guard entry.name.count > NameTransform.maxShortPlainLength else { return false }
                if case .long(let name, _) = try format.backingName(entry.name, dirIV: iv) { return name == hashed }
                return false
            }
        }
        if let found { dir.longNames.withLock { $0[hashed] = found.name } }
        return found?.name
    }
}

/// What the kernel may name: every node by ID, and the node of each entry by what it is.
struct ReverseNodeIndex {
    var byID: [UInt64: ReverseFileSystem.Node]
    var byKey: [ReverseNodeKey: UInt64] = [:]
    var nextID = ReverseFileSystem.rootID + 1

    init(root: ReverseFileSystem.Node) {
        byID = [root.id: root]
    }
}

/// What a node stands for: an entry of a directory, every name of an inode with more
/// than one link (so that they are one node, as they are one inode), or a file of the view's own.
enum ReverseNodeKey: Hashable, Sendable {
    case entry(of: UInt64, name: [UInt8])
    case inode(UInt64)
    case own(of: UInt64, name: String)
}

/// An open file or directory of the view.
enum ReverseHandle: Sendable {
    case file(ReverseFormat.OpenFile)
    case own([UInt8])
    case listing([ReverseFileSystem.Listed])
}

extension ReverseFileSystem {
    /// A node of the view: every stored property is a `let`, the lookup count atomic and
    /// the long names in a Mutex.
    final class Node: Sendable {
        enum Kind: Sendable {
            /// A directory with its IV; `foreign`: on another file system, shown empty.
            case directory(iv: [UInt8], foreign: Bool)
            /// A file, symlink or special file of PLAINDIR.
            case plain
            /// A file of the view's own, `content` its bytes.
            case own
        }

        let id: UInt64
        let kind: Kind
        let parent: Node?
        /// The plaintext name in its parent, and the path from PLAINDIR (empty for the root).
        let name: [UInt8]
        let path: [UInt8]
        let ino: UInt64
        let device: dev_t
        /// The bytes of a file of the view's own.
        let content: [UInt8]?
        let lookups = Atomic<UInt64>(0)
        let longNames = Mutex<[String: [UInt8]]>([:])
        /// What the index knows it by (nil for the root).
        let key: ReverseNodeKey?

        init(id: UInt64, key: ReverseNodeKey?, kind: Kind, parent: Node?, name: [UInt8], path: [UInt8], ino: UInt64, device: dev_t) {
            (self.id, self.key, self.kind, self.parent, self.name, self.path) = (id, key, kind, parent, name, path)
            (self.ino, self.device, self.content) = (ino, device, nil)
        }

        init(own id: UInt64, key: ReverseNodeKey, content: [UInt8], parent: Node) {
            (self.id, self.key, self.kind, self.parent, self.name, self.path) = (id, key, .own, parent, [], [])
            (self.ino, self.device, self.content) = (ReverseFileSystem.ownInodes | id, parent.device, content)
        }

        /// The IV of this directory (empty for any other node).
        var iv: [UInt8] {
            if case .directory(let iv, _) = kind { return iv }
            return []
        }
    }
}

/// The entries a reverse view leaves out (`--exclude`): a pattern without `/` matches an
/// entry's name at any depth, one with `/` its path from PLAINDIR (a leading `/` is
/// PLAINDIR itself), both as fnmatch(3) patterns; an excluded directory leaves out all it
/// holds.
public struct ReverseExcludes: Sendable {
    private let names: [[CChar]]
    private let paths: [[CChar]]

    public init(_ patterns: [String]) {
        names = patterns.filter { !$0.contains("/") }.map { Array($0.utf8CString) }
        paths = patterns.filter { $0.contains("/") }.map { pattern in
            Array(String(pattern.drop { $0 == "/" }).utf8CString)
        }
    }

    /// Whether the entry at `path` (from PLAINDIR), named `name`, is left out.
    public func excludes(path: [UInt8], name: [UInt8]) -> Bool {
        guard !names.isEmpty || !paths.isEmpty else { return false }
        let matches = { (patterns: [[CChar]], subject: [UInt8], flags: Int32) -> Bool in
            let c = (subject + [0]).map { CChar(bitPattern: $0) }
            return patterns.contains { fnmatch($0, c, flags) == 0 }
        }
        return matches(names, name, 0) || matches(paths, path, FNM_PATHNAME)
    }
}
