// ChildProcess is the one way coffer starts other programs — the daemon, the KDF
// helper, an --extpass command, fusermount3 — with posix_spawn, handing each child
// exactly the descriptors it is meant to have, and waits for them.
import CofferSystem
import Glibc

enum ChildProcess {
    /// posix_spawn of this very binary (/proc/self/exe) with `arguments`; see `spawn`.
    static func spawnSelf(_ arguments: [String], descriptors: [Int32: Int32], newSession: Bool) throws -> pid_t {
        try spawn("/proc/self/exe", arguments, descriptors: descriptors, newSession: newSession)
    }

    /// posix_spawn of `program` (looked up in PATH when it has no slash) with `arguments`.
    /// In the child, each key of `descriptors` is a copy of its value, the other standard
    /// descriptors are /dev/null, and nothing else of ours is inherited. `newSession`
    /// detaches it (setsid).
    static func spawn(_ program: String, _ arguments: [String], descriptors: [Int32: Int32], newSession: Bool) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Through descriptors above every source and target first: a source may itself be
        // another mapping's target (the status pipe's write end may be fd 4, which the
        // secret pipe is to become) or a standard descriptor that /dev/null is about to
        // replace (a caller started with 0 and 1 closed), and file actions run in order.
        let mappings = descriptors.sorted { $0.key < $1.key }
        let base = (Array(descriptors.keys) + Array(descriptors.values) + [2]).max()! + 1
        for (i, (_, source)) in mappings.enumerated() { posix_spawn_file_actions_adddup2(&actions, source, base + Int32(i)) }
        for fd: Int32 in 0...2 where descriptors[fd] == nil {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
        }
        for (i, (target, _)) in mappings.enumerated() {
            posix_spawn_file_actions_adddup2(&actions, base + Int32(i), target)
        }
        // Nothing else of ours reaches the child (a caller's pipe or socket held open by
        // the daemon would make the caller wait for it forever).
        try Sys.addCloseFrom(&actions, max(3, (descriptors.keys.max() ?? 2) + 1))

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        if newSession { posix_spawnattr_setflags(&attributes, Sys.spawnNewSession) }

        var argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = program.contains("/") ? posix_spawn(&pid, program, &actions, &attributes, &argv, environ)
            : posix_spawnp(&pid, program, &actions, &attributes, &argv, environ)
        guard rc == 0 else { throw Errno(rc, "posix_spawn") }
        return pid
    }

    /// Waits until `pid` has ended; how it ended.
    @discardableResult
    static func wait(_ pid: pid_t) -> WaitStatus { Sys.wait(pid) }

    /// Runs `program` with `arguments` (argv[0] first) to its end, standard input and
    /// output on /dev/null; returns its wait status and what it wrote to standard error.
    static func run(_ program: String, _ arguments: [String]) throws -> (status: WaitStatus, errors: String) {
        let pipe = try Sys.pipe()
        let pid = try spawn(program, arguments, descriptors: [2: pipe.write.rawValue], newSession: false)
        pipe.write.close()
        var errors: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let source = pipe.read.rawValue
        while let n = try? buffer.withUnsafeMutableBytes({ try Sys.read(source, into: $0) }), n > 0 {
            errors += buffer.prefix(n)
        }
        pipe.read.close()
        return (wait(pid), String(decoding: errors, as: UTF8.self))
    }
}
