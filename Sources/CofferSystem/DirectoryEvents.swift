// DirectoryEvents watches directories for changes — entries created, removed, moved in
// or out, closed after writing, their attributes changed — through fanotify, which says
// for each change whether this process made it. One fanotify group; each directory is
// one mark. A write is seen when its writer closes the file (one event per close, not
// per write: this process's own writes would otherwise cost an event each).
import CLinux
import Glibc

public final class DirectoryEvents: Sendable {
    /// One change in a watched directory.
    public struct Event {
        /// The directory's key, as `watch` returned it; empty for a queue overflow.
        public let directory: [UInt8]
        /// The entry's name in the directory; empty when the event names none.
        public let name: String
        /// The change was made by this process (coffer's own request).
        public let isOwn: Bool
        /// Only content or attributes changed; the entry itself is the same.
        public let isModification: Bool
        /// The kernel's queue overflowed and dropped events: anything may have changed.
        public let isOverflow: Bool
    }

    private let group: FileDescriptor
    /// Ends a `wait` early: written by `stop()`.
    private let wake: Sys.Pipe

    /// fanotify_init(2). Throws where fanotify with file handles is unavailable (before
    /// Linux 5.13 for an unprivileged user, or without CONFIG_FANOTIFY).
    public init() throws {
        let fd = clinux_fanotify_init()
        guard fd >= 0 else { throw Errno(errno, "fanotify_init") }
        group = FileDescriptor(owning: fd)
        wake = try Sys.pipe()
    }

    /// Watches directory `fd` (any descriptor of it) and returns its key, which the events
    /// of the directory carry. Throws ENOSPC when the user's limit of marks is reached,
    /// and EOPNOTSUPP/EXDEV where the file system has no file handles.
    public func watch(_ fd: Int32) throws -> [UInt8] {
        var key = [UInt8](repeating: 0, count: Int(clinux_DIRECTORY_KEY_MAX))
        let length = try retryOnInterrupt("name_to_handle_at") { clinux_directory_key(fd, &key, Int32(key.count)) }
        try retryOnInterrupt("fanotify_mark") { clinux_fanotify_watch(group.rawValue, fd, 1) }
        return Array(key.prefix(Int(length)))
    }

    /// Stops watching directory `fd`.
    public func unwatch(_ fd: Int32) {
        _ = clinux_fanotify_watch(group.rawValue, fd, 0)
    }

    /// Seconds a reader pauses after each batch of events, so that a burst is read in few
    /// reads (the kernel merges repeated events meanwhile): this process's own changes,
    /// which it only throws away, then cost it little. A change is seen that much later.
    public static let batching = 0.002

    /// Waits for events and returns those that arrived (several at once when they queue
    /// up); an empty array once `stop()` was called.
    public func wait() throws -> [Event] {
        while true {
            var fds = [pollfd(fd: group.rawValue, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: wake.read.rawValue, events: Int16(POLLIN), revents: 0)]
            _ = try retryOnInterrupt("poll") { poll(&fds, 2, -1) }
            if fds[1].revents != 0 { return [] }
            let events = try read()
            if !events.isEmpty { return events }
        }
    }

    /// Ends the current and every later `wait`.
    public func stop() {
        var byte: UInt8 = 1
        _ = Glibc.write(wake.write.rawValue, &byte, 1)
    }

    private static let bufferSize = 64 << 10

    private func read() throws -> [Event] {
        var buffer = [UInt8](repeating: 0, count: Self.bufferSize)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(group.rawValue, $0.baseAddress, $0.count) }
        if count < 0 {
            if errno == EAGAIN || errno == EINTR { return [] }
            throw Errno(errno, "read of fanotify events")
        }
        var events: [Event] = []
        var key = [UInt8](repeating: 0, count: Int(clinux_DIRECTORY_KEY_MAX))
        var offset = 0
        let pid = getpid()
        buffer.withUnsafeBytes { bytes in
            key.withUnsafeMutableBufferPointer { keyBuffer in
                var event = clinux_directory_event()
                event.key = keyBuffer.baseAddress
                while clinux_fanotify_next(bytes.baseAddress, count, &offset, &event) == 1 {
                    let changes = event.mask & ~clinux_FAN_ONDIR
                    let modification = clinux_FAN_CLOSE_WRITE | clinux_FAN_ATTRIB
                    events.append(Event(directory: Array(keyBuffer.prefix(Int(event.key_length))),
                                        name: String(cString: event.name),
                                        isOwn: event.pid == pid,
                                        isModification: changes != 0 && changes & ~modification == 0,
                                        isOverflow: changes & clinux_FAN_Q_OVERFLOW != 0))
                }
            }
        }
        return events
    }
}
