// SocketPath decides where a mount's control socket lives: a directory only its owner
// can enter ($XDG_RUNTIME_DIR/coffer, /run/coffer for root, else /tmp/coffer-UID, each
// created 0700 and verified), and a name derived from the mountpoint.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

public enum SocketPath {
    public enum Failure: Error, CustomStringConvertible {
        case unsafeDirectory(String, String, purpose: String = "the control socket")

        public var description: String {
            switch self {
            case .unsafeDirectory(let path, let why, let purpose): return "refusing to use \(path) for \(purpose): \(why)"
            }
        }
    }

    /// The socket directory for the current user, created and verified.
    public static func directory(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> String {
        let uid = geteuid()
        let path: String
        if uid == 0 {
            path = "/run/coffer"
        } else if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            path = runtime + "/coffer"
        } else {
            path = "/tmp/coffer-\(uid)"
        }
        try ensurePrivateDirectory(path, uid: uid)
        return path
    }

    /// Creates `path` with mode 0700 if missing, then checks that it is a real directory
    /// (not a symlink), owned by `uid`, and that nobody else can enter it. `purpose`
    /// names its use in the error.
    package static func ensurePrivateDirectory(_ path: String, uid: uid_t, purpose: String = "the control socket") throws {
        let fail = { (why: String) in Failure.unsafeDirectory(path, why, purpose: purpose) }
        do {
            try Sys.mkdir(path, in: AT_FDCWD, mode: 0o700)
        } catch let error as Errno {
            if error.code != EEXIST { throw fail(error.text) }
        }
        let st: stat
        do { st = try Sys.stat(path, in: AT_FDCWD) } catch let error as Errno { throw fail(error.text) }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw fail("not a directory (a symlink?)") }
        guard st.st_uid == uid else {
            // Another user made it first (in /tmp anyone can): say so, and the way round it.
            let wayRound = purpose == "the control socket" ? "--socket PATH, or set XDG_RUNTIME_DIR" : "--state-dir DIR"
            throw fail("owned by uid \(st.st_uid), not \(uid): another user holds it; give \(wayRound)")
        }
        guard st.st_mode & 0o077 == 0 else { throw fail("mode \(String(st.st_mode & 0o777, radix: 8)) lets others in (must be 0700)") }
    }

    /// The socket's file name for a mountpoint (canonical path): its last component,
    /// made safe and short, and a hash of the whole path (sockets are limited to 107 bytes).
    public static func name(forMountpoint mountpoint: String) -> String {
        let last = mountpoint.split(separator: "/").last.map(String.init) ?? "root"
        let safe = String(last.unicodeScalars.map { scalar -> Character in
            let kept = scalar.isASCII && (CharacterSet.alphanumerics.contains(scalar) || "._-".unicodeScalars.contains(scalar))
            return kept ? Character(scalar) : "_"
        }.prefix(24))
        let hash = Hash.blake2b256(Array(mountpoint.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
        return "\(safe)-\(hash).sock"
    }

    /// The default socket path of a mountpoint, for the daemon and for clients.
    public static func forMountpoint(_ mountpoint: String) throws -> String {
        try directory() + "/" + name(forMountpoint: mountpoint)
    }
}
