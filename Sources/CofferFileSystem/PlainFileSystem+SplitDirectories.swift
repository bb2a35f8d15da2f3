// A directory made on two machines before they synced: each gave it its own IV file and
// encrypted its names under it, and the sync engine kept one IV file and a conflict copy
// of the other. Every name stays served, under either IV, and the next change in the
// directory settles it on the one IV (FORMAT.md §5).
import CofferCrypto
import CofferSystem
import CofferVault
import Foundation
import Glibc

extension PlainFileSystem {
    /// The plaintext name of backing entry `backing` of `dir` under an alternate IV, if
    /// one decrypts it (nil if none does, or the directory has no alternate IV).
    func plaintextNameUnderAlternateIVs(_ backing: String, in dir: Node, keys: Keys) -> [UInt8]? {
        guard let alternates = try? alternateIVs(dir, keys: keys) else { return nil }
        for alternate in alternates {
            if let name = try? keys.codecs.names.plaintextName(ofBacking: backing, dirIV: alternate.iv, in: dir.fd) { return name }
        }
        return nil
    }

    /// The existing backing entry of plaintext `name` under an alternate IV of `dir`.
    func backingNameUnderAlternateIVs(_ name: [UInt8], in dir: Node, keys: Keys) throws -> BackingName? {
        for alternate in try alternateIVs(dir, keys: keys) {
            let backing = try keys.codecs.names.backingName(for: name, dirIV: alternate.iv)
            if exists(backing.name, in: dir) { return backing }
        }
        return nil
    }

    /// Settles a directory with alternate IVs on its own IV: each entry whose name is
    /// encrypted under an alternate IV is renamed to its name under the directory's IV
    /// (a long name's new sidecar written first, the old one removed after), then the
    /// alternate IV file goes. Crash-safe: every entry has exactly one backing name at
    /// every moment, readable under an IV file that is still there. Where the same name
    /// exists under both IVs (both machines made it), the one from the alternate IV gets
    /// " (1)" (" (2)", …) before its extension. Both machines settle the same way, so
    /// their sync engine sees the same renames. Called before a change in `dir`.
    func settleSplitDirectory(_ dir: Node, keys: Keys) throws {
        guard dir.isDirectory, let alternates = try? alternateIVs(dir, keys: keys), !alternates.isEmpty else { return }
        let iv = try directoryIV(dir, keys: keys)
        var renamed: [[UInt8]] = []
        for alternate in alternates {
            var moved: [String] = []
            for entry in try Sys.readDirectory(dir.fd) where !NameTransform.isReserved(entry.name) {
                // Entries already under the directory's IV stay.
                if (try? keys.codecs.names.plaintextName(ofBacking: entry.name, dirIV: iv, in: dir.fd)) != nil { continue }
                guard let name = try? keys.codecs.names.plaintextName(ofBacking: entry.name, dirIV: alternate.iv, in: dir.fd) else { continue }
                let shown = try moveUnderDirectoryIV(entry.name, plaintext: name, in: dir, iv: iv, keys: keys)
                moved.append(entry.name)
                renamed.append(name)
                if shown != name { renamed.append(shown) }
            }
            // Old long names' sidecars go last: a conflict copy of a long name reads the original's.
            for old in moved { NameTransform.removeSidecar(ofEntry: old, in: dir.fd) }
            try Sys.unlink(alternate.name, in: dir.fd)
            logger.notice("settled a directory made on two machines (backing inode \(dir.ino)): its names are now all under one IV")
        }
        dir.setDirectoryIV(iv)  // and no alternates any more
        // The kernel may hold these names with the inodes they named before: drop them
        // (not from this request's thread, which the kernel may hold the directory for).
        let id = nodes.id(of: dir), hooks = self.hooks, names = renamed
        DispatchQueue.global().async { names.forEach { hooks.invalidate($0, in: id) } }
    }

    /// Renames backing entry `backing` (plaintext `name`) to its name under `iv`, or, if
    /// that is taken, to the first free " (N)" variant. Returns the plaintext name it has now.
    private func moveUnderDirectoryIV(_ backing: String, plaintext name: [UInt8], in dir: Node, iv: [UInt8],
                                      keys: Keys) throws -> [UInt8] {
        var candidate = name
        for n in 1...1000 {
            let target = try keys.codecs.names.backingName(for: candidate, dirIV: iv)
            let wroteSidecar = try NameTransform.writeSidecar(target, in: dir.fd)
            // Its content moves to the new place first.
            let rebound = try rebind(.entry(backing, in: dir), shownAs: name, in: dir, to: Place(dirIV: iv, name: candidate), keys: keys)
            do {
                try Sys.rename(backing, in: dir.fd, to: target.name, in: dir.fd, flags: RENAME_NOREPLACE)
                return candidate
            } catch let error as Errno where error.code == EEXIST {
                rebound?()
                if wroteSidecar { NameTransform.removeSidecar(target, in: dir.fd) }
                guard let next = ConflictName.display(original: name, markers: Array(" (\(n))".utf8)) else { throw error }
                candidate = next
            }
        }
        throw Errno(EEXIST, "settling a directory made on two machines")
    }
}
