// CanonicalBytes builds the fixed-order byte strings that a config's checksum and the
// associated data of its key slots are made of (docs/FORMAT.md §3, §13): a tag and a
// zero byte, then u32 and u64 big-endian integers and `str` fields (u16 big-endian
// length ‖ UTF-8 bytes).
struct CanonicalBytes {
    private(set) var bytes: [UInt8]

    /// Starts with `tag` ‖ 0x00.
    init(tag: String) { bytes = Array(tag.utf8) + [0] }

    mutating func u32(_ v: Int) { bytes += withUnsafeBytes(of: UInt32(truncatingIfNeeded: v).bigEndian, Array.init) }

    mutating func u64(_ v: UInt64) { bytes += withUnsafeBytes(of: v.bigEndian, Array.init) }

    mutating func str(_ s: String) {
        let utf8 = Array(s.utf8)
        bytes += withUnsafeBytes(of: UInt16(truncatingIfNeeded: utf8.count).bigEndian, Array.init) + utf8
    }

    mutating func append(_ raw: [UInt8]) { bytes += raw }
}
