// ProcessCalls wraps what the command line and the control socket need of processes and
// streams: waiting for a child and reading its wait status, spawning in a new session,
// signals, the dumpable flag, a socket peer's credentials, and reads, polls and accepts with
// EINTR retried here (the one place, with `retryOnInterrupt`).
import CLinux
import Glibc

/// How a child ended (waitpid's status).
public struct WaitStatus: Sendable, Equatable {
    public let raw: Int32
    public init(_ raw: Int32) { self.raw = raw }
    /// The exit status (0 if it was killed).
    public var exitStatus: Int32 { clinux_exit_status(raw) }
    /// The signal that killed it (0 if it exited).
    public var signal: Int32 { clinux_term_signal(raw) }
    /// Exited with status 0.
    public var succeeded: Bool { signal == 0 && exitStatus == 0 }
}

/// A Unix socket peer's credentials (SO_PEERCRED).
public struct PeerCredentials: Sendable {
    public var pid: pid_t = 0
    public var uid: uid_t = 0
    public var gid: gid_t = 0
    public init() {}
}

extension Sys {
    /// posix_spawnattr flag: the child starts a new session (setsid).
    public static var spawnNewSession: Int16 { clinux_POSIX_SPAWN_SETSID }

    /// waitpid(2) until `pid` has ended; its status (raw 0 if there was none to wait for).
    @discardableResult
    public static func wait(_ pid: pid_t) -> WaitStatus {
        var status: Int32 = 0
        _ = try? retryOnInterrupt("waitpid") { waitpid(pid, &status, 0) }
        return WaitStatus(status)
    }

    /// waitpid(2) with WNOHANG: the status if `pid` has ended, else nil.
    public static func waitIfEnded(_ pid: pid_t) -> WaitStatus? {
        var status: Int32 = 0
        guard let ended = try? retryOnInterrupt("waitpid", { waitpid(pid, &status, WNOHANG) }), ended > 0 else { return nil }
        return WaitStatus(status)
    }

    /// kill(2): sends `signal` to process `pid` (EPERM: not ours to signal).
    public static func signal(_ pid: pid_t, _ signal: Int32) throws {
        try retryOnInterrupt("kill") { Glibc.kill(pid, signal) }
    }

    /// prctl(PR_SET_DUMPABLE): whether the process may be dumped or ptraced by its user.
    public static func setDumpable(_ dumpable: Bool) { _ = clinux_set_dumpable(dumpable ? 1 : 0) }

    /// prctl(PR_SET_PDEATHSIG): this process gets `signal` when the thread that started it
    /// ends (its parent exiting, or killed). Then, if the parent is gone already (it ended
    /// before the call), raises it at once.
    public static func endWithParent(_ parent: pid_t, signal: Int32 = SIGKILL) {
        _ = clinux_set_parent_death_signal(signal)
        if getppid() != parent { raise(signal) }
    }

    /// The credentials of the peer of Unix socket `fd`, or nil.
    public static func peerCredentials(_ fd: Int32) -> PeerCredentials? {
        var peer = PeerCredentials()
        return clinux_peer_credentials(fd, &peer.pid, &peer.uid, &peer.gid) == 0 ? peer : nil
    }

    /// read(2) once into `buffer`: the bytes read, 0 at the end of the stream.
    public static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        try retryOnInterrupt("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// recv(2) with MSG_DONTWAIT: the bytes read (0 at the end), or nil if none are there.
    public static func receiveAvailable(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws -> Int? {
        do {
            return try retryOnInterrupt("recv") { recv(fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT)) }
        } catch let error as Errno where error.code == EAGAIN || error.code == EWOULDBLOCK {
            return nil
        }
    }

    /// send(2) with MSG_DONTWAIT | MSG_NOSIGNAL: whether all of `buffer` went into the
    /// socket's buffer at once (false if it did not fit, in part or whole, or the peer
    /// is gone). For a peer that must never hold up the sender.
    public static func sendWithoutWaiting(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) -> Bool {
        let sent = (try? retryOnInterrupt("send") { Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }) ?? -1
        return sent == buffer.count
    }

    /// poll(2): the number of descriptors ready (0 on a timeout).
    @discardableResult
    public static func poll(_ fds: inout [pollfd], timeout milliseconds: Int32) throws -> Int32 {
        try retryOnInterrupt("poll") { Glibc.poll(&fds, nfds_t(fds.count), milliseconds) }
    }

    /// accept(2) of listening socket `fd`, close-on-exec: the new connection's descriptor.
    public static func accept(_ fd: Int32) throws -> Int32 {
        let connection = try retryOnInterrupt("accept") { Glibc.accept(fd, nil, nil) }
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        return connection
    }

    /// flock(2) with `operation` (LOCK_EX | LOCK_NB…).
    public static func lockFile(_ fd: Int32, _ operation: Int32) throws {
        try retryOnInterrupt("flock") { flock(fd, operation) }
    }
}
