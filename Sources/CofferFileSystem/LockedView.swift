// The state of the locked view (PlainFileSystem+Drops): what a lock keeps, from the
// lock to the next unlock, for the files made while locked in `unless-open` directories.
// Made at the lock once no operation runs with the keys; handed to operations through
// PlainFileSystem's `lockedGate`, which the unlock closes (waiting for those in flight)
// before it converts the drops. ViewTransition holds back operations that meet the
// view while a lock or an unlock is deciding.
import CofferCrypto
import CofferVault
import Dispatch
import Synchronization

/// One lock's locked view.
///
/// Locks: `directories` (the map) is held only to find, add or remove a directory; a
/// directory's `names` for one change of that directory — the rename, unlink or rmdir
/// that makes it, never an fsync, and never a file's making (made under its new sealed
/// name first, entered after); a rename between two directories takes both, in the
/// order of their keys. No other lock of the view is taken under one of them.
final class LockedView: Sendable {
    struct Key: Hashable, Comparable {
        let dev: UInt64
        let ino: UInt64
        init(_ node: Node) { dev = node.dev; ino = node.ino }
        static func < (a: Key, b: Key) -> Bool { (a.dev, a.ino) < (b.dev, b.ino) }
    }

    /// An entry made while locked — or a file from before the lock that the kernel knew
    /// in a directory that takes drops (so that a delivery begun just before the lock can
    /// still be renamed or removed): its backing name is then its encrypted name until a
    /// rename while locked gives it a sealed one.
    struct Drop {
        var backing: String
        let node: Node
        /// A file's own key, made while locked; nil for a directory, or a file from before
        /// the lock (it can be renamed and removed, not opened anew: one open at the lock
        /// has its key with its node alone, so that the key goes at its last close).
        let cipher: ContentCipher?
        let isDirectory: Bool
        /// A symlink's target, made while locked (format 8): readlink answers it until the
        /// unlock converts the symlink.
        var target: [UInt8]? = nil
        /// Made, or renamed, while locked: its backing name is sealed (listed while
        /// locked, converted at the unlock).
        var isSealed: Bool { DropName.isDrop(backing) }
    }

    /// What changes in a directory while locked.
    struct Names {
        /// Entries made since the lock, by name.
        var drops: [[UInt8]: Drop] = [:]
        /// The names it held at the lock (takesDrops), as digests under the view's
        /// `digest`: a name from before the lock is never given a second file.
        var existing: Set<[UInt8]> = []
    }

    /// A directory reachable while locked.
    final class Directory: Sendable {
        let node: Node
        /// New entries may be made in it (it is unless-open), not only passed through.
        let takesDrops: Bool
        /// Its IV, which the sealed name of a drop made in it is bound to (format 7): read
        /// at the lock, or chosen when it was made while locked.
        let iv: [UInt8]?
        /// Names kept from before the lock, leading to directories that take drops.
        let passages: [[UInt8]: Node]
        let names: Mutex<Names>

        init(node: Node, takesDrops: Bool, iv: [UInt8]?, passages: [[UInt8]: Node] = [:], names: Names = Names()) {
            self.node = node
            self.takesDrops = takesDrops
            self.iv = iv
            self.passages = passages
            self.names = Mutex(names)
        }
    }

    /// Two directories' names, taken for a rename (`second` nil: both are one).
    struct NamePair {
        var from: Names
        fileprivate var second: Names?
        var to: Names {
            get { second ?? from }
            set { if second != nil { second = newValue } else { from = newValue } }
        }
    }

    /// The drop key's public half, which names and keys made while locked are sealed to.
    let publicKey: [UInt8]
    /// The key of the name digests of this lock (wiped at the unlock).
    let digest: KeyedDigest
    let directories: Mutex<[Key: Directory]>

    init(publicKey: [UInt8], digest: KeyedDigest, directories: [Key: Directory]) {
        self.publicKey = publicKey
        self.digest = digest
        self.directories = Mutex(directories)
    }

    func directory(_ node: Node) -> Directory? { directories.withLock { $0[Key(node)] } }

    /// Whether `name` stood in the directory of `names` at the lock and was not removed since.
    func existed(_ name: [UInt8], in names: Names) -> Bool { names.existing.contains(digest(name)) }

    /// The drop of `node`, in whichever directory it is.
    func drop(of node: Node) -> Drop? {
        for dir in directories.withLock({ Array($0.values) }) {
            let found = dir.names.withLock { names in
                names.drops.values.first { $0.node.dev == node.dev && $0.node.ino == node.ino }
            }
            if let found { return found }
        }
        return nil
    }

    /// Runs `body` with the names of `from` and `to`, both locked (in the order of
    /// their keys). The names are moved out for the call, so that changing them copies
    /// nothing, and back after it.
    static func withNames<R>(_ from: Directory, _ to: Directory, _ body: (inout NamePair) throws -> R) rethrows -> R {
        if from === to {
            return try from.names.withLock { names in
                var pair = NamePair(from: take(&names), second: nil)
                defer { names = pair.from }
                return try body(&pair)
            }
        }
        let (first, second) = Key(from.node) < Key(to.node) ? (from, to) : (to, from)
        return try first.names.withLock { a in
            try second.names.withLock { b in
                let fromFirst = first === from
                var pair = fromFirst ? NamePair(from: take(&a), second: take(&b)) : NamePair(from: take(&b), second: take(&a))
                defer { (a, b) = fromFirst ? (pair.from, pair.second!) : (pair.second!, pair.from) }
                return try body(&pair)
            }
        }
    }

    private static func take(_ names: inout Names) -> Names {
        defer { names = Names() }
        return names
    }
}

/// Marks a lock or an unlock under way, for the operations that must see how it ends (a
/// file that keeps its key, the locked view made or ended): they wait for the end with
/// no lock held, while the lock drains the operations in flight (up to its bound) and
/// reads what it keeps, or the unlock converts the drops.
final class ViewTransition: Sendable {
    /// The semaphores of the operations waiting; nil while none is under way.
    private let waiting = Mutex<[DispatchSemaphore]?>(nil)

    func begin() { waiting.withLock { $0 = $0 ?? [] } }

    func end() {
        let waiters = waiting.withLock { waiting in
            defer { waiting = nil }
            return waiting ?? []
        }
        waiters.forEach { $0.signal() }
    }

    /// Returns at once if no transition is under way, else when it ends.
    func waitUntilSettled() {
        let semaphore: DispatchSemaphore? = waiting.withLock { waiting in
            guard waiting != nil else { return nil }
            let semaphore = DispatchSemaphore(value: 0)
            waiting!.append(semaphore)
            return semaphore
        }
        semaphore?.wait()
    }
}
