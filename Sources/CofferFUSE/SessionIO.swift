// KillPrivNegotiation asks the kernel for FUSE_HANDLE_KILLPRIV_V2, which libfuse 3.14
// (Debian 12's) cannot negotiate: it never puts a "handle killpriv" flag in its INIT
// reply. Without it the kernel, to keep setuid/setgid and file capabilities honest,
// asks the daemon for `security.capability` before every write (a second round trip
// per write) and fetches attributes before every chown. With it, the kernel marks
// inodes it has checked once as needing no check (SB_NOSEC/S_NOSEC) and leaves
// clearing setuid/setgid to the file system, which PlainFileSystem does (write,
// truncate, open with O_TRUNC, chown).
//
// The means is libfuse's custom I/O hook: reads pass through untouched except that the
// INIT request's unique ID and offered flags are noted; the one reply with that ID
// gets the flag added, if the kernel offered it. Every other reply passes through.
import CFuse
import Glibc
import Synchronization

enum KillPrivNegotiation {
    /// Installs the hooks on a mounted session (`fd` is its /dev/fuse descriptor).
    static func install(on session: OpaquePointer, fd: Int32) -> Bool {
        var io = fuse_custom_io()
        io.read = { fd, buffer, count, _ in
            let n = Glibc.read(fd, buffer, count)
            if n >= MemoryLayout<fuse_in_header>.size + MemoryLayout<fuse_init_in>.size, let buffer {
                let header = buffer.load(as: fuse_in_header.self)
                if header.opcode == FUSE_INIT.rawValue {
                    let offered = buffer.load(fromByteOffset: MemoryLayout<fuse_in_header>.size, as: fuse_init_in.self).flags
                    negotiation.withLock { $0 = InitRequest(unique: header.unique, offered: offered) }
                }
            }
            return n
        }
        io.writev = { fd, iov, count, _ in
            if count == 2, let iov, iov[1].iov_len >= MemoryLayout<fuse_init_out>.size,
               let header = iov[0].iov_base?.load(as: fuse_out_header.self), header.error == 0,
               let reply = iov[1].iov_base {
                negotiation.withLock { request in
                    guard request.unique == header.unique, request.offered & UInt32(FUSE_HANDLE_KILLPRIV_V2) != 0 else { return }
                    var out = reply.load(as: fuse_init_out.self)
                    out.flags |= UInt32(FUSE_HANDLE_KILLPRIV_V2)
                    reply.storeBytes(of: out, as: fuse_init_out.self)
                    request.unique = 0
                }
            }
            return Glibc.writev(fd, iov, count)
        }
        return fuse_session_custom_io(session, &io, fd) == 0
    }
}

/// The INIT request the kernel sent: its unique ID and the flags it offered.
private struct InitRequest: Sendable {
    var unique: UInt64
    var offered: UInt32
}

/// What the hooks share (C function pointers capture nothing): written when INIT arrives.
private let negotiation = Mutex(InitRequest(unique: 0, offered: 0))
