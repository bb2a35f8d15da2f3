// PathText shapes a path for a one-line message: one the kernel refuses as too long is
// shown by its two ends, not by all of its bytes.
import Glibc

public enum PathText {
    /// The longest path Linux takes, in bytes (PATH_MAX less its NUL).
    public static let maximum = Int(PATH_MAX) - 1

    /// Whether Linux refuses `path` as too long (ENAMETOOLONG): the whole of it, or one name.
    public static func isTooLong(_ path: String) -> Bool {
        path.utf8.count >= Int(PATH_MAX) || path.split(separator: "/").contains { $0.utf8.count > Int(NAME_MAX) }
    }

    /// The one line that says `path` is too long, naming it by its two ends.
    public static func tooLong(_ path: String) -> String {
        "\(elided(path)) is too long a path (\(path.utf8.count) bytes; Linux allows \(maximum), and \(NAME_MAX) per name)"
    }

    /// `path` itself, or its first and last 40 characters around "…" when it is longer than 100.
    public static func elided(_ path: String) -> String {
        guard path.count > 100 else { return path }
        return String(path.prefix(40)) + "…" + String(path.suffix(40))
    }
}
