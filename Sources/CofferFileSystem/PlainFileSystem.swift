// PlainFileSystem is the plaintext view of a vault: POSIX operations on nodes that the
// kernel names by ID, each translated into *at() calls on the backing directory with
// names, contents, symlink targets and xattrs encrypted. It holds the keys behind a
// gate: while locked, every operation but stat/statfs of the root fails with EACCES.
//
// It knows nothing of FUSE: the bridge above it decodes requests, calls one method,
// and replies with its result or its thrown error.
import CofferCrypto
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging
import Synchronization

/// Sendable: every stored property is a `let` of a Sendable type; what changes (the
/// keys, the operations in flight) is owned by the `gate` (KeyGate).
public final class PlainFileSystem: Sendable {
    public struct Options: Sendable {
        /// chown new entries to the calling user (a root daemon serving other users).
        public var preserveOwner = false
        /// Watch CIPHERDIR for other programs' changes (OtherWriters); `followOtherWriters()`
        /// starts following them. Without it, everything is cached briefly.
        public var watchOtherWriters = false
        /// Most backing directories watched at once (beyond: cached briefly).
        public var watchLimit = Int.max
        /// The machine's state directory for this vault, where the undo journal lives
        /// (nil: in CIPHERDIR itself, as tests without a machine do).
        public var stateDirectory: String?
        public init(preserveOwner: Bool = false, watchOtherWriters: Bool = false, watchLimit: Int = .max,
                    stateDirectory: String? = nil) {
            self.preserveOwner = preserveOwner
            self.watchOtherWriters = watchOtherWriters
            self.watchLimit = watchLimit
            self.stateDirectory = stateDirectory
        }
    }

    /// Who asked: new entries belong to them when `preserveOwner` is set.
    public struct Caller: Sendable {
        public var uid: uid_t
        public var gid: gid_t
        public init(uid: uid_t, gid: gid_t) { self.uid = uid; self.gid = gid }

        /// Whether the kernel would let this caller keep setuid/setgid bits through a
        /// write or truncate (CAP_FSETID). The daemon sees only IDs: root counts as
        /// privileged, everyone else as not.
        var keepsSetID: Bool { uid == 0 }
    }

    /// A node handed to the kernel, with its plaintext attributes.
    public struct Entry {
        public let node: UInt64
        public let attributes: stat
        /// Seconds the kernel may cache the name and the attributes (OtherWriters).
        public var validFor = OtherWriters.longCache
    }

    /// One key domain's keys and the codecs built on them (docs/FORMAT.md §12, format 8).
    struct DomainKeys: Sendable {
        let domain: KeyDomain
        let set: KeySet
        let codecs: VaultCodecs

        init(_ domain: KeyDomain, _ set: KeySet, longSymlinkTargets: Bool) {
            self.domain = domain
            self.set = set
            codecs = VaultCodecs(set, longSymlinkTargets: longSymlinkTargets)
        }
    }

    /// The keys present: while unlocked the vault domain's and, from format 8, the
    /// after-first-unlock domain's. An operation takes those of the inode each step works
    /// on (`in`): a directory's are its class's, any other inode's its directory's.
    struct Keys: Sendable {
        let vault: DomainKeys?
        let afterFirstUnlock: DomainKeys?

        /// The keys of `domain`; EACCES where a lock took them.
        func of(_ domain: KeyDomain) throws -> DomainKeys {
            switch domain {
            case .vault: if let vault { return vault }
            case .afterFirstUnlock: if let afterFirstUnlock { return afterFirstUnlock }
            }
            throw Errno(EACCES, "locked")
        }

        /// The keys of `node`'s domain.
        func `in`(_ node: Node) throws -> DomainKeys { try of(node.keyDomain) }

        /// The after-first-unlock domain's metadata key, to tell a class record of that
        /// domain (nil before format 8, or with `lock --all`).
        var afterFirstUnlockRecords: SealedBox? { afterFirstUnlock?.set.metadata }

        /// Zeroes every key held.
        func wipe() {
            vault?.set.wipe()
            afterFirstUnlock?.set.wipe()
        }
    }

    public let vault: Vault
    /// The block layout of the vault's format.
    let layout: BlockLayout
    /// Directory IV files carry tags binding them to their places (format 5 on).
    let bindsDirectories: Bool
    /// Files made while locked are bound to their directory and themselves (format 7 on).
    let bindsDrops: Bool
    let options: Options
    let nodes: NodeTable
    /// The vault's undo journal (nil on a backing file system coffer cannot write).
    let journal: UndoJournal?
    /// Directories whose IV file this daemon has made durable.
    let durableDirectories = DurableDirectories()
    /// The directories the kernel holds open (their listings go at the lock).
    let openDirectories = OpenDirectories()
    /// The writeback started behind long sequential writes (WriteBehind).
    let writeBehindStarts = WriteBehindStarts()
    /// Other programs' changes to CIPHERDIR, and the cache policy they call for.
    let otherWriters: OtherWriters
    /// The keys while unlocked, and the count of operations running with them: atomics
    /// on an operation's path (KeyGate); `lock()` waits for the operations in flight on
    /// a semaphore, holding no lock.
    ///
    /// Lock order, the one place it is written (each lock is taken only after those
    /// before it on its line, never the other way round):
    ///
    ///     locking:  Gate.turn (a semaphore: one unlock or lock at a time, held while it
    ///               waits; no Mutex is held then) → Gate.state; then `keyTurn` (a
    ///               semaphore, taken alone by a class change that holds every operation:
    ///               PlainFileSystem+Conversion). Under it, a lock closes the gate and
    ///               drains the operations in flight, reads what it keeps and opens the
    ///               locked view; an unlock closes the locked view (draining the
    ///               operations on it), converts the drops and opens the gate
    ///               (`transition` marks both, and a class change, for the operations that
    ///               must see how they end). KeyGate.drained is held only to find the
    ///               semaphore to wait on or to signal, ViewTransition.waiting only to
    ///               add a waiter or wake them.
    ///     workers:  Node.contentLock (R or W)
    ///               → UndoJournal.rewrites (R) → UndoJournal.state;
    ///               Node.contentLock → FileIDCache, VolatileBlocks;
    ///               while locked: LockedView.directories, or a directory's
    ///               LockedView.names (two for a rename, in the order of their keys)
    ///               → NodeTable.table → Node.state, Node.opened
    ///
    /// Leaves (nothing is taken under them): Node.state, Node.opened, EntryNames, FileIDCache,
    /// OpenDirectory.listing, OpenDirectories.open,
    /// VolatileBlocks, DurableDirectories, UndoJournal.state, WriteBehindStarts.waiting.
    /// NodeTable.table and Node.state may be taken with or without Node.contentLock held.
    /// The in-flight count is the workers' shared hold on the keys: `lock()` closes the
    /// gate and then waits (up to `lockWaitBound`) for the count to drain, which is what
    /// excludes workers.
    private let gate = KeyGate<Keys>()
    /// The locked view while locked and taking drops (PlainFileSystem+Drops), and the
    /// count of operations running on it: opened by a lock once it has decided what it
    /// keeps, closed by an unlock before it converts the drops.
    let lockedGate = KeyGate<LockedView>()
    /// Under way from a lock's closing of the gate until the files that keep their keys
    /// have them and the locked view is open, and from an unlock's closing of the locked
    /// view until the gate is open: an operation refused at a gate waits for it to end.
    let transition = ViewTransition()
    /// One at a time: an unlock, a lock's closing of the view, a class change that holds
    /// every operation (PlainFileSystem+Conversion). A semaphore: waiting is its purpose.
    let keyTurn = DispatchSemaphore(value: 1)
    /// Seconds a lock waits for operations in flight before it wipes the keys anyway.
    public let lockWaitBound = 2.0
    /// Where damage reports and other log lines go: the daemon's log (none by default,
    /// as in tests).
    public let logger: Logger
    /// What this file system tells the layer above it.
    let hooks: Hooks
    /// CLOCK_MONOTONIC seconds of the last operation that needed the keys (idle lock).
    private let lastActivity = Atomic<Int64>(PlainFileSystem.monotonicSeconds())

    /// What the file system tells the layer above it, given at init and fixed from then on.
    /// What `Hooks.noticed` tells.
    public enum Notice: Sendable {
        /// Damage was refused (EIO): the plaintext path and what is wrong.
        case damage(path: String, what: String)
        /// A sync engine's conflict copy appeared, shown under this plaintext path.
        case conflictCopy(path: String)
    }

    public struct Hooks: Sendable {
        /// A node's attributes changed in a way the reply to the request does not show
        /// (setuid dropped by a write, blocks put back after a crash): the kernel must
        /// fetch them again.
        public var attributesChanged: @Sendable (UInt64) -> Void
        /// The kernel must drop its pages and attributes of the node (writing dirty pages
        /// back through the daemon first): another program changed its backing inode, or
        /// the mount locks. Never called from a request thread (the kernel may hold the
        /// node's page locks for the request).
        public var invalidateNode: @Sendable (UInt64) -> Void
        /// The kernel must drop what it caches of this plaintext name in the directory,
        /// found or absent: another program changed the entry, or the mount locks. The
        /// name's bytes are valid only during the call (they may be zeroed after it).
        /// Never called from a request thread (the kernel may hold the directory's lock).
        public var invalidateEntry: @Sendable (UInt64, UnsafeBufferPointer<UInt8>) -> Void
        /// Something the mount's owner would want to hear of happened (the daemon tells
        /// programs subscribed to its events). Called from request and watch threads; it
        /// must not wait.
        public var noticed: @Sendable (Notice) -> Void

        public init(attributesChanged: @escaping @Sendable (UInt64) -> Void = { _ in },
                    invalidateNode: @escaping @Sendable (UInt64) -> Void = { _ in },
                    invalidateEntry: @escaping @Sendable (UInt64, UnsafeBufferPointer<UInt8>) -> Void = { _, _ in },
                    noticed: @escaping @Sendable (Notice) -> Void = { _ in }) {
            self.attributesChanged = attributesChanged
            self.invalidateNode = invalidateNode
            self.invalidateEntry = invalidateEntry
            self.noticed = noticed
        }

        /// `invalidateEntry` of a name held in an array.
        func invalidate(_ name: [UInt8], in parent: UInt64) {
            name.withUnsafeBufferPointer { invalidateEntry(parent, $0) }
        }
    }

    public init(vault: Vault, options: Options = Options(), hooks: Hooks = Hooks(),
                logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) throws {
        self.vault = vault
        self.layout = BlockLayout.of(format: vault.config.format)
        self.bindsDirectories = vault.config.bindsDirectories
        self.bindsDrops = vault.config.bindsDrops
        self.options = options
        self.hooks = hooks
        self.logger = logger
        // The root node is the vault's own directory, reached through its handle (never
        // by opening vault.path again, which may name another directory by now).
        let root = try vault.root.reopenDirectory(flags: O_PATH)
        let rootStat = try Sys.stat(root.rawValue)
        // Keep well below the descriptor limit: descriptors are also needed for open files.
        var threshold = Int.max
        var limit = rlimit()
        if getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 {
            threshold = max(256, Int(min(limit.rlim_cur, 1 << 30)) * 6 / 10)
        }
        // The node owns the descriptor from here on.
        nodes = NodeTable(root: Node(fd: root, stat: rootStat), pressureThreshold: threshold,
                          onPressure: NodePressureRelief(invalidateEntry: hooks.invalidateEntry).relieve)
        logger.info("node table: relief above \(threshold) cached inodes")
        otherWriters = OtherWriters(enabled: options.watchOtherWriters, limit: options.watchLimit, logger: logger)
        otherWriters.watch(nodes.root)
        do {
            journal = try Self.openJournal(vault: vault, stateDirectory: options.stateDirectory, logger: logger)
        } catch let error as Errno where error.code == EROFS || error.code == EACCES {
            journal = nil
        }
    }

    /// The undo journal: in the machine's state directory for the vault. A journal that
    /// an older coffer kept in CIPHERDIR is used once more if it holds records a crash
    /// may need (its mount ended in a crash), and removed once it holds none.
    static func openJournal(vault: Vault, stateDirectory: String?, logger: Logger) throws -> UndoJournal {
        let root = vault.root.rawValue
        guard let stateDirectory else { return try UndoJournal(directory: root) }
        if UndoJournal.exists(in: root) {
            let legacy = try UndoJournal(directory: root)
            if legacy.hasPending {
                logger.notice("""
                    undo journal: using the one an older coffer left in CIPHERDIR after a crash; after a clean unmount the journal moves to \
                    \(stateDirectory)
                    """)
                return legacy
            }
            try UndoJournal.remove(in: root)
        }
        let state = try FileDescriptor.open(stateDirectory, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        return try UndoJournal(directory: state.rawValue, data: root)
    }

    /// Tells the layer above that `node`'s attributes changed (see `Hooks`).
    func attributesChanged(_ node: UInt64) { hooks.attributesChanged(node) }

    // MARK: The gate

    /// Derives the subkeys from `master` and opens the view. The master key is wiped.
    /// Files made while locked become ordinary entries first (PlainFileSystem+Drops).
    public func unlock(_ master: MasterKey) {
        let long = vault.config.storesLongSymlinkTargets
        let keys = Keys(vault: DomainKeys(.vault, vault.keys(from: master, domain: .vault), longSymlinkTargets: long),
                        afterFirstUnlock: vault.config.hasKeyDomains
                            ? DomainKeys(.afterFirstUnlock, vault.keys(from: master, domain: .afterFirstUnlock), longSymlinkTargets: long) : nil)
        master.wipe()
        lastActivity.store(Self.monotonicSeconds(), ordering: .relaxed)
        keyTurn.wait()
        defer { keyTurn.signal() }
        transition.begin()
        let (view, stuck) = lockedGate.close(waitingAtMost: lockWaitBound)
        if stuck > 0 { logger.warning("unlock: \(stuck) operation(s) on the locked view still running after \(lockWaitBound) s") }
        enterDomain(nodes.root, in: nil, keys: keys)
        if let view {
            convertDrops(view, keys: keys)
            view.digest.wipe()
        }
        gate.open(keys)?.wipe()
        vaultKeysPresent.store(true, ordering: .releasing)
        transition.end()
    }

    /// Locks in place, the whole sequence: (1) the kernel drops every cached inode while
    /// the keys are still there, so that it writes dirty pages (shared mmaps) back through
    /// the daemon; (2) new operations are refused, those in flight drained, the keys
    /// wiped (`closeView`); (3) the kernel drops every inode again and every name it may
    /// cache — also names given by rename and link, and negative entries — so that
    /// nothing decrypted stays in its page, attribute or dentry caches and every lookup
    /// asks the daemon, which answers EACCES; the names are zeroed here too. Freed heap
    /// pages that held plaintext go back to the kernel. With `kernelCaches` false (the
    /// session is gone, nothing serves the kernel's write-back) steps 1 and 3 only forget.
    ///
    /// A file of an `unless-open` directory that is open at the lock keeps its own key
    /// (PlainFileSystem+Classes), and the kernel its pages, until its last close.
    ///
    /// From format 8 the after-first-unlock domain keeps its keys, its nodes their names and
    /// the kernel its caches of them, unless `all` (`coffer lock --all`, a suspend, the end
    /// of the mount): the directories of that class stay usable, reached through the
    /// locked view's passages where their parents lock.
    public func lock(kernelCaches: Bool = true, all: Bool = false) {
        let keep: KeyDomain? = all || !vault.config.hasKeyDomains ? nil : .afterFirstUnlock
        if kernelCaches { knownNodes().filter { nodes.node($0).keyDomain != keep }.forEach(hooks.invalidateNode) }
        closeView(keeping: keep)
        // Nodes the kernel learnt during step 1 are in this fresh list too.
        if kernelCaches {
            knownNodes().filter { nodes.node($0).keptKey == nil && nodes.node($0).keyDomain != keep }.forEach(hooks.invalidateNode)
        }
        forgetCachedEntries(keeping: keep) { parent, name in if kernelCaches { hooks.invalidateEntry(parent, name) } }
        Sys.releaseFreeMemory()
    }

    /// Closes the view and forgets the plaintext names it kept for damage reports (the
    /// names the kernel may cache are forgotten by `forgetCachedEntries`).
    ///
    /// New operations fail with EACCES at once; operations in flight may finish with the
    /// keys, but only for `lockWaitBound` seconds: an operation can be stuck for good (a
    /// hung backing file system, a FIFO), and a lock that waits for it forever is a
    /// denial of the lock. After the bound the keys are wiped anyway. That is memory-safe
    /// for the stuck operation: it holds a reference to the key objects, so their memory
    /// stays allocated, and every use of a key goes through `SecureBytes.lend`, which the
    /// wipe (`retire`) waits for and after which it throws — the operation then fails
    /// instead of computing with a half-zeroed key (and never writes data or names
    /// sealed under zeros).
    ///
    /// What the lock keeps is decided after the drain, with no lock held: the classes
    /// read, the open files of `unless-open` directories given their keys, the locked
    /// view made. An operation refused at the gate meanwhile waits for that (`transition`).
    /// `keep`: the domain whose keys stay (the gate opens again with them alone).
    private func closeView(keeping keep: KeyDomain?) {
        keyTurn.wait()
        defer { keyTurn.signal() }
        transition.begin()
        let (retiring, stuck) = gate.close(waitingAtMost: lockWaitBound)
        vaultKeysPresent.store(false, ordering: .releasing)
        let kept = keep == nil ? nil : retiring?.afterFirstUnlock
        if let retiring, retiring.vault != nil {
            let unlessOpen = unlessOpenDirectories(keys: retiring)
            keepOpenFiles(keys: retiring, unlessOpen: unlessOpen)
            let reachable = kept == nil ? [] : Set(nodes.allNodes().filter { $0.isDirectory && $0.keyDomain == .afterFirstUnlock }
                .map(LockedView.Key.init))
            if let view = lockedView(keys: retiring, unlessOpen: unlessOpen, reachable: reachable) { _ = lockedGate.open(view) }
        }
        if let kept { _ = gate.open(Keys(vault: nil, afterFirstUnlock: kept)) }
        transition.end()
        nodes.forgetNames(keeping: kept?.domain)
        openDirectories.forgetListings()
        retiring?.vault?.set.wipe()
        if kept == nil { retiring?.afterFirstUnlock?.set.wipe() }
        // After the wipe: a key prepared from a retired key is not kept (BlockKeySlot); nor
        // is the key of a file made while locked, read from its key record since the unlock.
        for node in nodes.allNodes() where node.keyDomain != kept?.domain {
            node.blockKeys.wipe()
            node.forgetSealedKey()
        }
        if stuck > 0 { logger.warning("lock: \(stuck) operation(s) still running after \(lockWaitBound) s; keys wiped under them") }
    }

    /// Calls `invalidate` with every (directory, name) the kernel may hold in its dentry
    /// cache — found, created, renamed, linked or looked up in vain since the last call —
    /// and then zeroes those names. The name's bytes are valid only during the call.
    func forgetCachedEntries(keeping kept: KeyDomain? = nil, _ invalidate: (UInt64, UnsafeBufferPointer<UInt8>) -> Void) {
        for node in nodes.allNodes() where node.keyDomain != kept {
            guard let names = node.takeCachedNames() else { continue }
            let id = nodes.id(of: node)
            names.forEach { name in name.withUnsafeBufferPointer { invalidate(id, $0) } }
            names.forgetAll()
        }
    }

    /// The vault domain's keys are here (a lock that keeps the after-first-unlock domain
    /// leaves the gate open with that domain's alone).
    public var isUnlocked: Bool { vaultKeysPresent.load(ordering: .acquiring) }
    private let vaultKeysPresent = Atomic<Bool>(false)
    /// Locked with the after-first-unlock domain's keys kept (format 8).
    public var keepsAfterFirstUnlock: Bool { !isUnlocked && gate.isOpen }

    /// Runs `body` with the keys, or throws EACCES while locked. With `activity` false
    /// (the daemon's own housekeeping) it does not count for the idle lock.
    func withKeys<R>(activity: Bool = true, _ body: (Keys) throws -> R) throws -> R {
        // Refused at the gate while a lock, an unlock or a class change is under way:
        // asked again once it is over.
        guard let keys = gate.enter() ?? { transition.waitUntilSettled(); return gate.enter() }() else {
            throw Errno(EACCES, "locked")
        }
        defer { gate.leave() }
        if activity { lastActivity.store(Self.monotonicSeconds(), ordering: .relaxed) }
        return try lockedIfRetired { try body(keys) }
    }

    /// Runs `body` with the keys while no other operation runs (the gate closed, those in
    /// flight drained, new ones waiting for it: `transition`); one at a time with locks and
    /// unlocks (`keyTurn`). EACCES while locked; EBUSY if an operation is stuck in the
    /// backing file system.
    func withEveryOperationWaiting<R>(_ body: (Keys) throws -> R) throws -> R {
        keyTurn.wait()
        defer { keyTurn.signal() }
        transition.begin()
        defer { transition.end() }
        let (held, stuck) = gate.close(waitingAtMost: lockWaitBound)
        guard let keys = held else { throw Errno(EACCES, "locked") }
        defer { _ = gate.open(keys) }
        guard stuck == 0 else { throw Errno(EBUSY, "an operation is stuck in the backing file system") }
        guard keys.vault != nil else { throw Errno(EACCES, "locked") }
        return try body(keys)
    }

    /// Runs an operation in the view the mount is in, entered once (its gate counts the
    /// operation in until it returns): `unlocked` with the keys, `locked` with the locked
    /// view while locked with directories that take new files; EACCES while locked
    /// without one. A lock or unlock under way ends first.
    /// `target`: the node the operation works in; one of the after-first-unlock domain
    /// is served with that domain's keys while the rest of the vault is locked.
    func inView<R>(_ target: Node? = nil, locked: (LockedView) throws -> R, unlocked: (Keys) throws -> R) throws -> R {
        for attempt in 0..<2 {
            if let keys = gate.enter() {
                defer { gate.leave() }
                if keys.vault != nil || target?.keyDomain == .afterFirstUnlock {
                    lastActivity.store(Self.monotonicSeconds(), ordering: .relaxed)
                    return try lockedIfRetired { try unlocked(keys) }
                }
            }
            if let view = lockedGate.enter() {
                defer { lockedGate.leave() }
                return try locked(view)
            }
            if attempt == 0 { transition.waitUntilSettled() }
        }
        throw Errno(EACCES, "locked")
    }

    /// Runs `body` with the content cipher for `node`'s blocks, given a descriptor of the
    /// backing file: the vault's (or the file's sealed key's) while unlocked; while
    /// locked, the key the lock left the file (an `unless-open` file still open, or one
    /// made while locked), else EACCES. An operation refused at the gate while a lock is
    /// under way waits for the lock to decide which files keep their keys (milliseconds).
    func withContentKey<R>(_ node: Node, _ body: (_ cipher: (Int32) throws -> ContentCipher) throws -> R) throws -> R {
        for attempt in 0..<2 {
            if let keys = gate.enter() {
                defer { gate.leave() }
                if keys.vault != nil || node.keyDomain == .afterFirstUnlock {
                    lastActivity.store(Self.monotonicSeconds(), ordering: .relaxed)
                    return try lockedIfRetired { try body { try contentCipher($0, of: node, keys: keys) } }
                }
            }
            if attempt == 0 { transition.waitUntilSettled() }
        }
        guard let kept = node.keptKey else { throw Errno(EACCES, "locked") }
        return try lockedIfRetired { try body { _ in kept } }
    }

    /// `body`, with a key wiped under it (by a lock) reported as EACCES.
    private func lockedIfRetired<R>(_ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch CryptoError.keyRetired {
            throw Errno(EACCES, "locked")
        }
    }

    /// Seconds since the last operation that needed the keys.
    public var idleSeconds: Int64 { Self.monotonicSeconds() - lastActivity.load(ordering: .relaxed) }

    static func monotonicSeconds() -> Int64 { Int64(Sys.monotonicNow()) }

    // MARK: Attributes

    /// The plaintext view of a backing stat (of `fd`): sizes of files and symlinks converted.
    func plain(_ st: stat, of fd: Int32) -> stat {
        var out = st
        switch st.st_mode & S_IFMT {
        case S_IFREG:
            let size = Int64(st.st_size)
            // A damaged length still gets a size: the whole blocks before the cut.
            out.st_size = Int((try? layout.plainSize(cipherSize: size)) ?? layout.plainSizeOfWholeBlocks(cipherSize: size))
            out.st_blksize = Self.preferredIOSize
        case S_IFLNK where st.st_size == SymlinkCodec.referenceLength && vault.config.storesLongSymlinkTargets:
            // A long target: its length is its sidecar's.
            let reference = (try? Sys.readlink("", in: fd)).flatMap { SymlinkCodec.isReference($0) ? $0 : nil }
            let sidecar = reference.flatMap { try? Sys.stat($0, in: nodes.root.fd) }
            out.st_size = SymlinkCodec.plainLength(storedLength: Int(sidecar?.st_size ?? 0))
        case S_IFLNK:
            out.st_size = SymlinkCodec.plainLength(storedLength: Int(st.st_size))
        default:
            break
        }
        return out
    }

    /// A regular file's st_blksize: the largest request the mount takes (1 MiB). Tools
    /// that size their buffers from it (cp, cat, stdio) then ask for 1 MiB at a time —
    /// one WRITE request where 4 KiB would have been 256, and READs as large as the
    /// kernel lets them grow — instead of the backing file system's 4 KiB. Directories
    /// keep the backing one: glibc sizes a directory stream's buffer from it.
    static let preferredIOSize = 1 << 20

    /// Attributes of a node. The root answers even while locked, so that `mountpoint`,
    /// `df` and `stat` of the mount work.
    public func getattr(_ id: UInt64) throws -> stat {
        if id == NodeTable.rootID { return plain(try Sys.stat(nodes.root.fd), of: nodes.root.fd) }
        let node = nodes.node(id)
        // While locked: a directory on the way to files made while locked, such a file, or
        // a file a lock left its key.
        return try inView(node, locked: { view in
            guard isReachable(node, in: view) || node.keptKey != nil else { throw Errno(EACCES, "locked") }
            return plain(try Sys.stat(node.fd), of: node.fd)
        }) { _ in plain(try Sys.stat(node.fd), of: node.fd) }
    }

    /// Free space of the backing file system, scaled to plaintext bytes. Works while locked.
    public func statfs() throws -> statvfs {
        var st = try Sys.statvfs(nodes.root.fd)
        let scale = { (blocks: fsblkcnt_t) -> fsblkcnt_t in
            fsblkcnt_t(Double(blocks) * Double(BlockLayout.plainBlockSize) / Double(BlockLayout.cipherBlockSize))
        }
        st.f_blocks = scale(st.f_blocks)
        st.f_bfree = scale(st.f_bfree)
        st.f_bavail = scale(st.f_bavail)
        st.f_namemax = UInt(NameTransform.maxNameLength)
        return st
    }

    // MARK: Names

    /// Looks up `name` in directory `parent`: one name encryption, one openat, one fstat.
    public func lookup(parent: UInt64, name: [UInt8]) throws -> Entry {
        try inView(nodes.node(parent), locked: { try lockedLookup($0, parent: parent, name: name) }) { keys in
            let dir = nodes.node(parent)
            do {
                let backing = try backingName(name, in: dir, keys: keys)
                do {
                    return try repairingAfterCrash(try enter(backing.name, in: dir, plainName: name, keys: keys), keys: keys)
                } catch let error as Errno where error.code == ENOENT {
                    // Perhaps made while locked (here before a crash, or on another machine)
                    // and not converted yet.
                    if convertFoundDrops(in: dir, keys: keys), exists(backing.name, in: dir) {
                        return try enter(backing.name, in: dir, plainName: name, keys: keys)
                    }
                    // Not under this name: perhaps the name a sync engine's conflict copy is shown
                    // under, or a name made on another machine under the IV it gave the directory.
                    guard let other = try names(of: dir, keys: keys).find(name, exists: { $0 != backing.name && exists($0, in: dir) }) else {
                        throw error
                    }
                    return try enter(other.name, in: dir, plainName: name, keys: keys)
                }
            } catch let error as Errno where error.code == ENOENT {
                dir.rememberEntry(name)  // the kernel may cache the name as absent (or not yet arrived)
                throw error
            }
        }
    }

    /// After a crash, the first lookup of a file puts back the blocks that the crash
    /// tore from the undo journal's records, and cuts a tail of blocks the crash tore
    /// mid-append (`ContentFile.tornTail`), before the kernel learns the file's size.
    func repairingAfterCrash(_ entry: Entry, keys: Keys) throws -> Entry {
        guard let journal, journal.hasPending || journal.foundAtOpen else { return entry }
        let node = nodes.node(entry.node)
        guard node.isRegular, node.markCrashChecked() else { return entry }
        do {
            let (restored, cut) = try node.contentLock.writing { () -> ([Int64], Int64?) in
                let fd = try FileDescriptor.open(node.procPath, flags: O_RDWR | O_NONBLOCK)
                let file = try content(fd.rawValue, of: node, keys: keys)
                // From format 4: a file made just before a power cut whose header never
                // reached the disk is an empty file of its entry.
                if layout.endsInFinalBlock, journal.foundAtOpen, try Sys.stat(fd.rawValue).st_size == 0,
                   let (dir, name) = node.entry {
                    try initializeContent(fd.rawValue, name: name, in: dir, keys: keys)
                    return ([], 0)
                }
                guard let id = try file.fileID() else { return ([], nil) }
                let records = journal.pendingRecords(id)
                defer { journal.checked(id) }
                let restored = records.isEmpty ? [] : try file.tornBlocks(records, repair: true)
                return (restored, journal.foundAtOpen ? try file.tornTail(repair: true) : nil)
            }
            guard !restored.isEmpty || cut != nil else { return entry }
            if !restored.isEmpty {
                logger.notice("""
                    repaired: \(node.plaintextPath) (backing inode \(node.ino)): block\(restored.count == 1 ? "" : "s") \
                    \(restored.map(String.init).joined(separator: ", ")) torn by a crash, put back from the undo journal
                    """)
            }
            if let cut {
                logger.notice("""
                    repaired: \(node.plaintextPath) (backing inode \(node.ino)): its last blocks, appended after its last fsync and torn by a \
                    crash, cut; \(cut) bytes kept
                    """)
            }
            attributesChanged(entry.node)
            return Entry(node: entry.node, attributes: plain(try Sys.stat(node.fd), of: node.fd), validFor: entry.validFor)
        } catch {
            logger.error("damage: \(node.plaintextPath) (backing inode \(node.ino)): checking for a crash's torn blocks failed: \(error)")
            return entry
        }
    }

    /// What makes rewrites of `node`'s blocks crash-safe (nil without a journal).
    func rewriteSafety(_ node: Node, synchronous: Bool = false) -> RewriteSafety? {
        journal.map { RewriteSafety(journal: $0, volatile: node.volatileBlocks, synchronous: synchronous) }
    }

    /// Drops the undo records that no crash can need any more (after a syncfs); for the
    /// daemon's clean exit. A state directory left with nothing in it goes too, and the
    /// write-behind thread ends.
    public func finish() throws {
        writeBehindStarts.stop()
        try journal?.trim()
        // A journal left after this means the mount did not end cleanly (UndoJournal.foundAtOpen).
        if journal?.removeIfEmpty() == true, let stateDirectory = options.stateDirectory {
            _ = Glibc.rmdir(stateDirectory)  // only if empty: the directory itself is kept otherwise
        }
    }

    /// The backing name of `name` in `dir`. A damaged IV file is EIO and a log line naming
    /// the directory, whichever operation meets it.
    func backingName(_ name: [UInt8], in dir: Node, keys: Keys) throws -> BackingName {
        try keys.in(dir).codecs.names.backingName(for: name, dirIV: try directoryIV(dir, keys: keys))
    }

    /// The backing name of an existing entry `name` of `dir`: its encrypted name; if no
    /// entry has that, the sync engine's conflict copy that `name` shows, or its name
    /// under an alternate IV of the directory (PlainFileSystem+SplitDirectories). One
    /// stat; the backing name for a name that exists nowhere (the operation then fails).
    func existingBackingName(_ name: [UInt8], in dir: Node, keys: Keys) throws -> BackingName {
        try existingEntry(name, in: dir, keys: keys).backing
    }

    /// `existingBackingName`, with the entry's stat (nil if it exists nowhere).
    func existingEntry(_ name: [UInt8], in dir: Node, keys: Keys) throws -> (backing: BackingName, stat: stat?) {
        let backing = try backingName(name, in: dir, keys: keys)
        if let st = try? Sys.stat(backing.name, in: dir.fd) { return (backing, st) }
        guard let other = try names(of: dir, keys: keys).find(name, exists: { $0 != backing.name && exists($0, in: dir) }) else {
            return (backing, nil)
        }
        return (other, try? Sys.stat(other.name, in: dir.fd))
    }

    func exists(_ backingName: String, in dir: Node) -> Bool {
        (try? Sys.stat(backingName, in: dir.fd)) != nil
    }

    /// Opens backing entry `backingName` of `dir` as a node and counts one kernel lookup.
    /// `keys`: those present, to tell a directory's key domain (format 8).
    func enter(_ backingName: String, in dir: Node, plainName: [UInt8], keys: Keys? = nil) throws -> Entry {
        let fd = try FileDescriptor.open(backingName, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
        let st = try Sys.stat(fd.rawValue)
        let (node, isNew) = nodes.remember(fd: fd, stat: st)
        if isNew { otherWriters.watch(node) }
        node.setName(plainName, parent: dir)
        if let keys { enterDomain(node, in: dir, keys: keys, new: isNew) }
        dir.rememberEntry(plainName)
        return Entry(node: nodes.id(of: node), attributes: plain(st, of: node.fd), validFor: cacheSeconds(in: dir))
    }

    /// Sets the key domain of `node`, entered in `dir` (format 8, docs/FORMAT.md §12): an
    /// entry's is its directory's; a directory's is its class's, told by the key that opens
    /// its class record (read with its IV as it stands: the IV file's own tags are checked
    /// in that domain when the IV is first used). No record, or one no key present opens:
    /// the vault domain. A class change a crash cut is finished here if no operation can
    /// be running in the directory: it is `new` to the kernel (or the view is opening).
    func enterDomain(_ node: Node, in dir: Node?, keys: Keys, new: Bool = true) {
        guard vault.config.hasKeyDomains else { return }
        guard node.isDirectory else {
            if let dir { node.setKeyDomain(dir.keyDomain) }
            return
        }
        guard let iv = try? DirectoryIV.read(in: node.fd, bound: bindsDirectories).iv else { return node.setKeyDomain(.vault) }
        let record = try? ProtectionClass.readRecord(in: node.fd, dirIV: iv, box: keys.vault?.set.metadata,
                                                     afterFirstUnlock: keys.afterFirstUnlockRecords)
        node.setKeyDomain(record?.target.domain ?? .vault)
        if case .converting(let from, let to)? = record, new { finishConversion(node, from: from, to: to, keys: keys) }
    }

    /// The kernel dropped `count` references to `node`.
    public func forget(_ node: UInt64, count: UInt64) {
        if let gone = nodes.forget(node, count: count) { otherWriters.unwatch(gone) }
    }

    /// Node IDs the kernel holds, for cache invalidation.
    public func knownNodes() -> [UInt64] { nodes.allIDs() }


    /// Number of nodes in the table besides the root.
    public var nodeCount: Int { nodes.count }

    // MARK: Damage

    /// Logs content damage (a `VaultError` thrown by `body`) in one line naming the file
    /// and block, and rethrows it; ErrnoMapping makes it EIO.
    func reportingDamage<R>(_ node: Node, _ body: () throws -> R) throws -> R {
        do {
            return try body()
        } catch let error as VaultError {
            logger.error("damage: \(node.plaintextPath) (backing inode \(node.ino)): \(error)")
            hooks.noticed(.damage(path: node.plaintextPath, what: "\(error)"))
            throw error
        }
    }
}
