// OtherWriters keeps the plaintext view right when programs other than this daemon — a
// sync engine, a restore from backup, a shell — change CIPHERDIR while it is mounted.
//
// The caching assumption, and how it is kept true: the kernel may keep names and
// attributes for `longCache` seconds and a file's pages from one open to the next, which
// is what makes the metadata path fast. That is right only while every change comes
// through the mount. So every backing directory the kernel holds is watched (fanotify,
// which tells this daemon's own changes from others'); a change by another program
// invalidates exactly what it touched: the entry's name (a new lookup then finds the
// inode that is there now, never the replaced one), and the pages and attributes of an
// inode changed in place (when its writer closes it: DirectoryEvents). A reply races with such a change only in a directory another
// program has just changed, so for `settle` seconds after a change, and in directories
// that cannot be watched (the user's mark limit reached, a file system without file
// handles, no fanotify), the kernel caches for `shortCache` seconds only: a change
// shows at the next access, at worst after `shortCache`.
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging
import Synchronization

final class OtherWriters: Sendable {
    /// Seconds the kernel may cache entries and attributes where nothing else changes.
    static let longCache = 60.0
    /// …in a directory another program changed in the last `settle` seconds, or that is
    /// not watched: the longest a change there can stay unseen.
    static let shortCache = 1.0
    /// Milliseconds a directory counts as busy with another writer after its last change.
    static let settle: Int64 = 2_000

    /// Nil where fanotify is unavailable: nothing is watched, everything is cached briefly.
    private let events: DirectoryEvents?
    /// Watched directories by their key.
    private let watched = Mutex<[[UInt8]: Node]>([:])
    /// Most directories watched at once (the user's fanotify mark limit is shared with
    /// their other programs; `--watch-limit` lowers it).
    private let limit: Int
    /// Milliseconds when the kernel's event queue last overflowed (every directory busy).
    let overflowedAt = Atomic<Int64>(0)
    private let logger: Logger
    private let reportedLimit = Atomic<Bool>(false)

    init(enabled: Bool, limit: Int, logger: Logger) {
        self.logger = logger
        self.limit = limit
        guard enabled, limit > 0 else {
            events = nil
            if enabled {
                logger.notice("""
                    other writers of CIPHERDIR: not watched (--watch-limit 0); names and attributes are cached for \(Self.shortCache) s only
                    """)
            }
            return
        }
        do {
            events = try DirectoryEvents()
        } catch {
            events = nil
            logger.warning("other writers of CIPHERDIR: cannot watch it (\(error)); names and attributes are cached for \(Self.shortCache) s only")
        }
    }

    static func now() -> Int64 { Int64(Sys.monotonicNow() * 1000) }

    /// Watches backing directory `node`, if it can (else it stays unwatched: brief caching).
    func watch(_ node: Node) {
        guard let events, node.isDirectory else { return }
        let room = watched.withLock { $0.count < limit }
        guard room else { return reportLimit("more than \(limit) directories in the kernel's cache") }
        do {
            let key = try events.watch(node.fd)
            let replaced: Node? = watched.withLock { table in
                defer { table[key] = node }
                return table[key]
            }
            node.watchKey = key
            node.isWatched.store(true, ordering: .releasing)
            if let replaced, replaced !== node { replaced.isWatched.store(false, ordering: .releasing) }
        } catch {
            reportLimit("\(error)")
        }
    }

    /// Stops watching `node` (the kernel forgot it).
    func unwatch(_ node: Node) {
        guard let events, let key = node.watchKey else { return }
        node.watchKey = nil
        node.isWatched.store(false, ordering: .releasing)
        let owned = watched.withLock { table -> Bool in
            guard table[key] === node else { return false }
            table[key] = nil
            return true
        }
        if owned { events.unwatch(node.fd) }
    }

    private func reportLimit(_ why: String) {
        guard !reportedLimit.exchange(true, ordering: .relaxed) else { return }
        logger.warning("""
            other writers of CIPHERDIR: a directory cannot be watched (\(why)); such directories are cached for \(Self.shortCache) s only
            """)
    }

    /// The directory of a watched key.
    func directory(_ key: [UInt8]) -> Node? { watched.withLock { $0[key] } }

    /// Runs `handle` with every change another program makes, on a thread of its own,
    /// until `stop()`.
    func start(_ handle: @escaping @Sendable (DirectoryEvents.Event) -> Void) {
        guard let events else { return }
        let logger = self.logger
        BackgroundThread.start("coffer-watch") {
            while true {
                let batch: [DirectoryEvents.Event]
                do { batch = try events.wait() } catch {
                    logger.error("other writers of CIPHERDIR: watching ended: \(error)")
                    return
                }
                if batch.isEmpty { return }
                for event in batch where !event.isOwn { handle(event) }
                usleep(useconds_t(DirectoryEvents.batching * 1_000_000))
            }
        }
    }

    func stop() { events?.stop() }
}

extension PlainFileSystem {
    /// Seconds the kernel may cache entries of directory `dir`, and the attributes of the
    /// inodes they name (see OtherWriters).
    func cacheSeconds(in dir: Node?) -> Double {
        guard let dir, dir.isWatched.load(ordering: .acquiring) else { return OtherWriters.shortCache }
        let now = OtherWriters.now()
        let last = max(dir.changedByOthersAt.load(ordering: .relaxed), otherWriters.overflowedAt.load(ordering: .relaxed))
        return last != 0 && now - last < OtherWriters.settle ? OtherWriters.shortCache : OtherWriters.longCache
    }

    /// Seconds the kernel may cache names (found or absent) in directory `parent`.
    /// None while locked: a name absent then may only be hidden (PlainFileSystem+Drops).
    public func entryCacheSeconds(in parent: UInt64) -> Double { isUnlocked ? cacheSeconds(in: nodes.node(parent)) : 0 }

    /// Seconds the kernel may cache the attributes of `node`.
    public func attributeCacheSeconds(of id: UInt64) -> Double {
        let node = nodes.node(id)
        return cacheSeconds(in: id == NodeTable.rootID ? node : node.directory)
    }

    /// Whether the kernel may keep `node`'s pages from one open to the next: only where
    /// a change by another program would be seen.
    public func keepsPages(of id: UInt64) -> Bool { attributeCacheSeconds(of: id) == OtherWriters.longCache }

    /// Starts following other programs' changes (the daemon; `stopFollowingOtherWriters`
    /// ends it).
    public func followOtherWriters() {
        otherWriters.start { [self] event in changedByOthers(event) }
    }

    public func stopFollowingOtherWriters() { otherWriters.stop() }

    /// What another program changed: invalidates what the kernel may cache of it.
    func changedByOthers(_ event: DirectoryEvents.Event) {
        if event.isOverflow { return changedByOthersEverywhere() }
        guard let dir = otherWriters.directory(event.directory) else { return }
        dir.changedByOthersAt.store(OtherWriters.now(), ordering: .relaxed)
        // The inode now under the name, if the kernel holds it: its content or attributes
        // may have changed in place.
        if let st = try? Sys.stat(event.name, in: dir.fd), let node = nodes.known(st) {
            node.fileIDs.forget()
            hooks.invalidateNode(nodes.id(of: node))
        }
        if event.isModification { return }
        let dirID = nodes.id(of: dir)
        if event.name == DirectoryIV.fileName || DirectoryIV.isConflictCopy(event.name) {
            // Every name here may now mean another entry.
            dir.forgetDirectoryIV()
            return dir.cachedNameCopies().forEach { hooks.invalidate($0, in: dirID) }
        }
        if DropName.isDrop(event.name) {
            // Made while locked on another machine: converted at the next lookup or
            // listing here, under its name, which the kernel may hold as absent.
            dir.dropsChecked.store(false, ordering: .releasing)
            let name = try? withKeys(activity: false) { keys in
                try keys.vault?.set.drops.map { try DropName.decode(event.name, keys: $0, bound: bindsDrops).name }
            }
            if let name = name ?? nil { hooks.invalidate(name, in: dirID) }
            return
        }
        // A long name's sidecar may arrive after its entry: either event stands for the entry.
        var backing = event.name
        if backing.hasPrefix(NameTransform.longNamePrefix) && backing.hasSuffix(NameTransform.sidecarSuffix) {
            backing.removeLast(NameTransform.sidecarSuffix.count)
        }
        // Decoded as lookup and listing decode it (under an alternate IV too). A name that
        // does not decode names nothing the kernel can hold; a locked mount, the same.
        let name = try? withKeys(activity: false) { keys -> [UInt8]? in
            try names(of: dir, keys: keys).decode(backing, in: dir.fd)?.name
        }
        guard let name else { return }
        hooks.invalidate(name, in: dirID)
        // A sync engine's conflict copy that is there now: the owner hears of it.
        if ConflictName.parse(backingName: backing) != nil, exists(backing, in: dir) {
            let parent = dir.plaintextPath
            hooks.noticed(.conflictCopy(path: (parent == "/" ? "" : parent) + "/" + String(decoding: name, as: UTF8.self)))
        }
    }

    /// The kernel dropped events: anything may have changed. Every inode and every name
    /// the kernel may cache is invalidated, and every directory counts as busy.
    private func changedByOthersEverywhere() {
        otherWriters.overflowedAt.store(OtherWriters.now(), ordering: .relaxed)
        logger.notice("other writers of CIPHERDIR: too many changes at once; the kernel's caches of the mount are dropped")
        for node in nodes.allNodes() {
            node.fileIDs.forget()
            if node.isDirectory { node.forgetDirectoryIV() }
            let id = nodes.id(of: node)
            hooks.invalidateNode(id)
            node.cachedNameCopies().forEach { hooks.invalidate($0, in: id) }
        }
    }
}
