// Zeroing plaintext the daemon drops (names, symlink targets) before its memory is freed.
import Glibc

extension Array where Element: BitwiseCopyable {
    /// Zeroes the elements in place. Copy-on-write makes this safe on shared storage: only
    /// storage this array holds alone is zeroed (shared storage is copied first, and the
    /// copy zeroed), so a name another holder keeps (a dictionary key) stays intact.
    public mutating func zeroInPlace() {
        withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } }
    }
}
