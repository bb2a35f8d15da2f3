// VaultCodecs builds the codecs of a vault's metadata — names, symlink targets, xattrs —
// from one key set, the one place that says which subkey each codec takes.
import CofferCrypto

public struct VaultCodecs: Sendable {
    public let names: NameTransform
    public let symlinks: SymlinkCodec
    public let xattrs: XattrCodec

    /// `longSymlinkTargets`: the vault's config stores targets too long for a backing
    /// symlink in sidecars (`VaultConfig.storesLongSymlinkTargets`, format 2 on).
    public init(_ keys: KeySet, longSymlinkTargets: Bool) {
        names = NameTransform(cipher: keys.names)
        symlinks = SymlinkCodec(box: keys.metadata, longTargets: longSymlinkTargets)
        xattrs = XattrCodec(names: keys.xattrNames, box: keys.metadata)
    }
}
