// BackgroundThread is the one way the daemon starts a thread of its own: named in the
// kernel (so that `top -H`, `/proc/PID/task/*/comm` and gdb say what each does) and
// detached, its end left to what it runs. Each subsystem still owns when its thread stops.
import CLinux
import Foundation

public enum BackgroundThread {
    /// The longest name the kernel keeps (16 bytes with the NUL).
    public static let nameLimit = 15

    /// Starts `body` on a new thread named `name` (at most `nameLimit` bytes: the kernel
    /// would refuse a longer one).
    public static func start(_ name: String, _ body: @escaping @Sendable () -> Void) {
        assert(name.utf8.count <= nameLimit, "thread name \(name) is longer than the kernel keeps")
        let kernelName = String(decoding: name.utf8.prefix(nameLimit), as: UTF8.self)
        let thread = Thread {
            _ = clinux_set_thread_name(kernelName)
            body()
        }
        thread.name = name
        thread.start()
    }
}
