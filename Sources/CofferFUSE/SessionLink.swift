// SessionLink carries the plaintext file system's requests to invalidate kernel caches
// to a FUSE session that does not exist yet when the file system is made: the session
// needs the file system first (libfuse takes it as user data), and the file system takes
// its hooks at init. The session attaches itself once, in its own init. Before that
// there is no kernel cache of the mount, so nothing is there to invalidate, and a
// request is rightly dropped.
import CFuse
import Glibc
import Synchronization

public final class SessionLink: Sendable {
    /// The session's address; 0 before `attach` and after `detach`.
    private let session = Atomic<UInt>(0)

    public init() {}

    /// Called once, by the session's init.
    func attach(_ session: OpaquePointer) {
        let attached = self.session.compareExchange(expected: 0, desired: UInt(bitPattern: session), ordering: .releasing)
        precondition(attached.exchanged, "SessionLink: a second session attached")
    }

    /// Called by the session before it is destroyed (no request is served any more).
    func detach() { session.store(0, ordering: .releasing) }

    /// Tells the kernel to fetch `node`'s attributes again, keeping its pages. Safe from a
    /// request handler of the same node (no page lock is taken).
    public func attributesChanged(_ node: UInt64) {
        guard let session = OpaquePointer(bitPattern: session.load(ordering: .acquiring)) else { return }
        fuse_lowlevel_notify_inval_inode(session, node, -1, 0)
    }

    /// Tells the kernel to drop `node`'s pages and attributes (another program changed
    /// the backing file, or the mount locks). Not from a request handler: it waits for
    /// the node's page locks.
    public func invalidateNode(_ node: UInt64) {
        guard let session = OpaquePointer(bitPattern: session.load(ordering: .acquiring)) else { return }
        fuse_lowlevel_notify_inval_inode(session, node, 0, 0)
    }

    /// Tells the kernel to drop its entry `name` in directory `parent`, found or absent.
    /// Not from a request handler: it waits for the directory's lock.
    public func invalidateEntry(_ parent: UInt64, _ name: UnsafeBufferPointer<UInt8>) {
        guard let session = OpaquePointer(bitPattern: session.load(ordering: .acquiring)) else { return }
        // fuse_lowlevel_notify_inval_entry needs a NUL-terminated copy: zeroed after
        // the call (the name may be secret).
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: name.count + 1) { cName in
            defer { explicit_bzero(cName.baseAddress!, cName.count) }
            name.withMemoryRebound(to: CChar.self) { _ = cName.initialize(from: $0) }
            cName[name.count] = 0
            _ = fuse_lowlevel_notify_inval_entry(session, parent, cName.baseAddress, name.count)
        }
    }
}
