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
    /// How names decode in `dir` (DirectoryNames): its own IV, and those of the conflict
    /// copies of its IV file made for it.
    func names(of dir: Node, keys: Keys) throws -> DirectoryNames {
        let own = try directoryIV(dir, keys: keys)
        let alternates = ((try? alternateIVs(dir, keys: keys)) ?? []).map { DirectoryNames.Alternate(fileName: $0.name, iv: $0.iv) }
        return DirectoryNames(keys.codecs.names, own: own, alternates: alternates)
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
        guard dir.isDirectory, let split = try? names(of: dir, keys: keys), !split.alternates.isEmpty else { return }
        let iv = split.own
        var renamed: [[UInt8]] = []
        for alternate in split.alternates {
            var moved: [String] = []
            for entry in try Sys.readDirectory(dir.fd) where !NameTransform.isReserved(entry.name) {
                // Entries already under the directory's IV stay, and so do those of other alternates (their turn comes).
                guard let decoded = try? split.decode(entry.name, in: dir.fd), decoded.alternate == alternate.fileName else { continue }
                let shown = try moveUnderDirectoryIV(entry.name, plaintext: decoded.name, in: dir, iv: iv, keys: keys)
                moved.append(entry.name)
                renamed.append(decoded.name)
                if shown != decoded.name { renamed.append(shown) }
            }
            // Old long names' sidecars go last: a conflict copy of a long name reads the original's.
            for old in moved { NameTransform.removeSidecar(ofEntry: old, in: dir.fd) }
            try Sys.unlink(alternate.fileName, in: dir.fd)
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
