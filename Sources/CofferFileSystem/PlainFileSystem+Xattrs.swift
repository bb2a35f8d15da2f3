// Extended attributes of the plaintext view: every name and value encrypted, stored
// as "user." xattrs of the backing inode (docs/FORMAT.md §8).
import CofferCrypto
import CofferSystem
import Glibc

extension PlainFileSystem {
    /// "system." xattrs (POSIX ACLs) carry mode semantics the kernel would have to
    /// enforce; stored as opaque data they would make tools like `cp -a` believe an ACL
    /// replaced the mode. They are refused, so tools fall back to chmod.
    /// "security.capability" (file capabilities) is refused too: a FUSE mount is nosuid,
    /// so the kernel ignores it anyway, and the kernel asks for it before every write —
    /// knowing it is never stored lets that question be answered without any work.
    /// "security.selinux" is refused as well: with SELinux active the kernel labels FUSE
    /// files itself and never passes the label through; without it, a stored label means
    /// nothing. Saying "not supported" (rather than "no such attribute") lets tools
    /// remember it for the whole mount: `ls -l` then asks once, not once per file.
    private func refuseUnsupported(_ name: [UInt8]) throws {
        if name.starts(with: Self.systemPrefix) || name == Self.fileCapabilities || name == Self.selinuxLabel {
            throw Errno(EOPNOTSUPP, "xattr")
        }
    }

    private static let systemPrefix = Array("system.".utf8)
    private static let fileCapabilities = Array("security.capability".utf8)
    private static let selinuxLabel = Array("security.selinux".utf8)

    /// `user.coffer.class` is no stored xattr: it shows and sets a directory's protection
    /// class (PlainFileSystem+Classes).
    public func setxattr(_ id: UInt64, name: [UInt8], value: [UInt8], flags: Int32, caller: Caller) throws {
        try refuseUnsupported(name)
        if name == Self.classAttribute { return try setClass(id, value: value, caller: caller) }
        try withKeys { keys in
            let node = nodes.node(id)
            let backing = try keys.in(node).codecs.xattrs.backingName(for: name)
            let sealed = try keys.in(node).codecs.xattrs.sealValue(value, backingName: backing)
            try Sys.setXattr(node.procPath, backing, sealed, flags: flags)
        }
    }

    public func getxattr(_ id: UInt64, name: [UInt8]) throws -> [UInt8] {
        if name == Self.fileCapabilities { throw Errno(ENODATA, "getxattr") }
        try refuseUnsupported(name)
        if name == Self.classAttribute { return try showClass(id) }
        return try withKeys { keys in
            let node = nodes.node(id)
            let backing = try keys.in(node).codecs.xattrs.backingName(for: name)
            let sealed = try Sys.getXattr(node.procPath, backing)
            return try reportingDamage(node) { try keys.in(node).codecs.xattrs.openValue(sealed, backingName: backing) }
        }
    }

    /// The plaintext xattr names; backing xattrs that are not coffer's are left out.
    public func listxattr(_ id: UInt64) throws -> [[UInt8]] {
        try withKeys { keys in
            let node = nodes.node(id), xattrs = try keys.in(node).codecs.xattrs
            return try Sys.listXattrs(node.procPath).compactMap { xattrs.plaintextName(ofBacking: $0) }
        }
    }

    public func removexattr(_ id: UInt64, name: [UInt8], caller: Caller) throws {
        try refuseUnsupported(name)
        if name == Self.classAttribute { return try setClass(id, value: nil, caller: caller) }
        try withKeys { keys in
            let node = nodes.node(id)
            try Sys.removeXattr(node.procPath, try keys.in(node).codecs.xattrs.backingName(for: name))
        }
    }
}
