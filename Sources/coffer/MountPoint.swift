// MountPoint checks a mountpoint before mounting and finds coffer mounts in the mount table.
import CofferSystem
import Foundation
import Glibc

enum MountPoint {
    /// The absolute, symlink-free path of `path` (it must exist).
    static func canonical(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// One line of /proc/self/mountinfo: where, and what type.
    struct Mount {
        let path: String
        let type: String
        /// The mount's source (for coffer: the vault's path).
        let source: String
        /// The file system's own options (mountinfo's super options), as the kernel has
        /// them: what the mount really got, whatever spelling asked for it.
        var superOptions: [String] = []
        /// Its device, "MAJOR:MINOR" (a FUSE mount's names its /sys/class/bdi entry).
        var device = ""
    }

    /// The current mounts (mountinfo's paths are octal-escaped: \040 is a space).
    static func mounts() -> [Mount] {
        guard let bytes = try? KernelFiles.read("/proc/self/mountinfo") else { return [] }
        let text = String(decoding: bytes, as: UTF8.self)
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ")
            guard fields.count > 4, let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count else { return nil }
            let source = dash + 2 < fields.count ? unescape(String(fields[dash + 2])) : ""
            let options = dash + 3 < fields.count ? fields[dash + 3].split(separator: ",").map(String.init) : []
            return Mount(path: unescape(String(fields[4])), type: String(fields[dash + 1]), source: source,
                         superOptions: options, device: String(fields[2]))
        }
    }

    static func unescape(_ s: String) -> String {
        var out = [UInt8](), bytes = Array(s.utf8), i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "\\"), i + 3 < bytes.count,
               let v = UInt8(String(decoding: bytes[i + 1...i + 3], as: UTF8.self), radix: 8) {
                out.append(v)
                i += 4
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func isMounted(_ canonicalPath: String) -> Mount? {
        mounts().last { $0.path == canonicalPath }
    }

    /// The failure of a MOUNTPOINT argument that does not resolve: missing, or too long.
    static func missing(_ path: String) -> CommandFailure {
        if PathText.isTooLong(path) {
            return CommandFailure(status: .mountpointMissing, message: "mountpoint " + PathText.tooLong(path))
        }
        return CommandFailure(status: .mountpointMissing, message: "mountpoint \(path) does not exist")
    }

    /// Throws the failure a user should see if `path` cannot be mounted on.
    static func checkUsable(_ path: String) throws -> String {
        var st = stat()
        guard stat(path, &st) == 0 else {
            let error = Errno.current("stat")
            if error.code == ENOENT || error.code == ENAMETOOLONG { throw missing(path) }
            if error.code == ENOTCONN {
                throw CommandFailure(status: .mountpointBusy,
                                     message: "mountpoint \(path) is a mount whose daemon died; run fusermount3 -u \(path) first")
            }
            throw CommandFailure(status: .mountpointMissing, message: "mountpoint \(path): \(error.text)")
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            throw CommandFailure(status: .mountpointNotDirectory, message: "mountpoint \(path) is not a directory")
        }
        guard let canonical = canonical(path) else {
            throw CommandFailure(status: .mountpointMissing, message: "mountpoint \(path) cannot be resolved")
        }
        if isMounted(canonical) != nil {
            throw CommandFailure(status: .mountpointBusy, message: "mountpoint \(path) is already a mount point")
        }
        if let fd = try? FileDescriptor.open(canonical, flags: O_RDONLY | O_DIRECTORY) {
            if let entries = try? Sys.listDirectory(fd.rawValue), !entries.isEmpty {
                throw CommandFailure(status: .mountpointNotEmpty, message: "mountpoint \(path) is not empty")
            }
        }
        // Root opens /dev/fuse itself; other users go through the setuid fusermount3,
        // so for them it only has to exist.
        guard geteuid() == 0 ? access("/dev/fuse", R_OK | W_OK) == 0 : access("/dev/fuse", F_OK) == 0 else {
            throw CommandFailure(status: .fuseUnavailable,
                                 message: "/dev/fuse is unavailable (\(Errno.current("access").text)): is FUSE enabled in this kernel or container?")
        }
        return canonical
    }
}
