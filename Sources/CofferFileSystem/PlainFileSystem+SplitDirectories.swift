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
    /// copies of its IV file made for it; in a directory made on two machines, with the
    /// names its entries will settle to (one listing of it). `listed`: the names of a
    /// listing of `dir` the caller has just made, which spares a listing to look for
    /// conflict copies of the IV file where it shows none (nearly every directory).
    func names(of dir: Node, keys: Keys, listed: [String]? = nil) throws -> DirectoryNames {
        let own = try directoryIV(dir, keys: keys)
        let copies = listed.map { $0.contains(where: DirectoryIV.isConflictCopy) } ?? true
        // A copy that holds the directory's own IV (coffer's kept copy, while nothing
        // replaced the IV file) stands for no name.
        let alternates = !copies ? [] : ((try? alternateIVs(dir, keys: keys)) ?? []).filter { $0.iv != own }
        return try DirectoryNames(keys.in(dir).codecs.names, own: own, alternates: alternates).planningSettlement(in: dir.fd)
    }

    /// Settles a directory with alternate IVs on its own IV: each entry whose name is
    /// encrypted under an alternate IV is renamed to its name under the directory's IV
    /// (a long name's new sidecar written first, the old one removed after), then the
    /// alternate IV file goes. Crash-safe: every entry has exactly one backing name at
    /// every moment, readable under an IV file that is still there. Where the same name
    /// exists under both IVs (both machines made it), the one from the alternate IV gets
    /// " (1)" (" (2)", …) before its extension — the name SettlementPlan gave it, which
    /// listings showed it under until now. Both machines settle the same way, so their
    /// sync engine sees the same renames. Called before a change in `dir`.
    func settleSplitDirectory(_ dir: Node, keys: Keys) throws {
        // Most directories have no IV file copies: told from the node's cached list before
        // any names are built (a rename asks this three times).
        guard dir.isDirectory, (try? alternateIVs(dir, keys: keys))?.isEmpty != true,
              let split = try? names(of: dir, keys: keys), !split.alternates.isEmpty else { return }
        let iv = split.own
        var renamed: [[UInt8]] = []
        for alternate in split.alternates {
            var moved: [String] = []
            for entry in try Sys.readDirectory(dir.fd) where !NameTransform.isReserved(entry.name) {
                // Entries already under the directory's IV stay, and so do those of other alternates (their turn comes).
                guard let decoded = try? split.decode(entry.name, in: dir.fd), decoded.alternate == alternate.fileName else { continue }
                let name = split.settling[entry.name]?.name ?? decoded.name
                let shown = try moveUnderDirectoryIV(entry.name, plaintext: name, settlingAs: decoded.name, in: dir, iv: iv, keys: keys)
                moved.append(entry.name)
                renamed.append(name)
                if shown != name { renamed.append(shown) }
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

    /// Renames backing entry `backing` (plaintext `name`) to `planned` under `iv`, or, if
    /// another program took that meanwhile, to the first free " (N)" variant of `name`.
    /// Returns the plaintext name it has now.
    private func moveUnderDirectoryIV(_ backing: String, plaintext name: [UInt8], settlingAs planned: [UInt8], in dir: Node,
                                      iv: [UInt8], keys: Keys) throws -> [UInt8] {
        var candidate = planned
        for n in 1...1000 {
            let target = try keys.in(dir).codecs.names.backingName(for: candidate, dirIV: iv)
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
