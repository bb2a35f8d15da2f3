// VaultChecker walks a whole backing directory with the keys and reports every name,
// block, symlink target and xattr that fails authentication, read-only.
import CofferCrypto
import Glibc

public struct VaultProblem: CustomStringConvertible {
    /// Plaintext path of the damaged file, or of the directory holding a damaged name.
    public let path: String
    /// The backing (encrypted) name when the name itself is the problem.
    public let backingName: String?
    public let what: String

    public var description: String {
        backingName.map { "\(path)/<\($0)>: \(what)" } ?? "\(path): \(what)"
    }
}

public struct VaultCheckSummary {
    public var directories = 0
    public var files = 0
    public var bytes: Int64 = 0
    public var problems = 0
}

public final class VaultChecker {
    private let root: Int32
    private let keys: KeySet
    private let names: NameTransform
    private let symlinks: SymlinkCodec
    private let xattrs: XattrCodec
    public private(set) var summary = VaultCheckSummary()
    private let report: (VaultProblem) -> Void
    private let progress: (VaultCheckSummary) -> Void

    public init(vault: Vault, master: MasterKey, report: @escaping (VaultProblem) -> Void,
                progress: @escaping (VaultCheckSummary) -> Void = { _ in }) {
        root = vault.rootFD
        keys = KeySet(master: master)
        names = NameTransform(cipher: keys.names)
        symlinks = SymlinkCodec(box: keys.metadata, longTargets: vault.config.storesLongSymlinkTargets)
        xattrs = XattrCodec(names: keys.xattrNames, box: keys.metadata)
        self.report = { problem in report(problem) }
        self.progress = progress
    }

    deinit { keys.wipe() }

    private func problem(_ path: String, _ what: String, backingName: String? = nil) {
        summary.problems += 1
        report(VaultProblem(path: path.isEmpty ? "/" : path, backingName: backingName, what: what))
    }

    /// Checks everything below the vault root.
    public func run() -> VaultCheckSummary {
        checkDirectory(root, path: "")
        checkTargetSidecars()
        return summary
    }

    /// Long-target sidecars that some symlink named.
    private var namedTargetSidecars = Set<String>()

    /// Sidecars of long symlink targets that no symlink names (left by a crash between
    /// writing one and making the link, or removing the link and the sidecar).
    private func checkTargetSidecars() {
        guard let entries = try? Sys.listDirectory(root) else { return }
        for name in entries where name.hasPrefix(SymlinkCodec.sidecarPrefix) && !namedTargetSidecars.contains(name) {
            problem("", "orphan symlink-target sidecar (harmless)", backingName: name)
        }
    }

    private func checkDirectory(_ dir: Int32, path: String) {
        summary.directories += 1
        checkXattrs("/proc/self/fd/\(dir)", path: path)
        let iv: [UInt8]
        do {
            iv = try DirectoryIV.read(in: dir)
        } catch {
            return problem(path, "\(error); names in it cannot be read")
        }
        let entries: [Sys.DirectoryEntry]
        do { entries = try Sys.readDirectory(dir) } catch { return problem(path, "cannot list: \(error)") }
        let present = Set(entries.map(\.name))
        for entry in entries {
            if entry.name.hasPrefix(NameTransform.longNamePrefix) && entry.name.hasSuffix(NameTransform.sidecarSuffix)
                && !present.contains(String(entry.name.dropLast(NameTransform.sidecarSuffix.count))) {
                problem(path, "orphan long-name sidecar (harmless)", backingName: entry.name)
                continue
            }
            let name: [UInt8]
            do {
                guard let decoded = try names.plaintextName(ofBacking: entry.name, dirIV: iv, in: dir) else { continue }
                name = decoded
            } catch {
                problem(path, "\(error)", backingName: entry.name)
                continue
            }
            let childPath = path + "/" + String(decoding: name, as: UTF8.self)
            do {
                let st = try Sys.stat(entry.name, in: dir)
                switch st.st_mode & S_IFMT {
                case S_IFDIR:
                    let fd = try Sys.open(entry.name, in: dir, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
                    checkDirectory(fd, path: childPath)
                    Sys.close(fd)
                case S_IFREG:
                    checkFile(entry.name, in: dir, path: childPath)
                case S_IFLNK:
                    do {
                        let linkTarget = try Sys.readlink(entry.name, in: dir)
                        if let sidecar = symlinks.sidecar(of: linkTarget) { namedTargetSidecars.insert(sidecar) }
                        _ = try symlinks.decrypt(linkTarget, sidecarsIn: root)
                    } catch {
                        problem(childPath, "\(error)")
                    }
                default:
                    break
                }
            } catch {
                problem(childPath, "cannot read: \(error)")
            }
        }
    }

    private func checkFile(_ backingName: String, in dir: Int32, path: String) {
        summary.files += 1
        let fd: Int32
        // Non-blocking: a FIFO put in the file's place since the fstatat opens at once.
        do { fd = try Sys.open(backingName, in: dir, flags: O_RDONLY | O_NOFOLLOW | O_NONBLOCK) } catch {
            return problem(path, "cannot open: \(error)")
        }
        defer { Sys.close(fd) }
        guard let st = try? Sys.stat(fd), st.st_mode & S_IFMT == S_IFREG else {
            return problem(path, "was replaced by something other than a regular file while it was checked")
        }
        checkXattrs("/proc/self/fd/\(fd)", path: path)
        let file = ContentFile(fd: fd, cipher: keys.content)
        let size: Int64
        do { size = try file.plainSize() } catch { return problem(path, "\(error)") }
        // Block by block, so that every damaged block is named, not only the first.
        let chunk = Int(BlockLayout.plainBlockSize)
        var buffer = [UInt8](repeating: 0, count: chunk)
        var offset: Int64 = 0
        while offset < size {
            do {
                _ = try buffer.withUnsafeMutableBytes { try file.read(into: $0, at: offset) }
            } catch VaultError.blockDamaged(let index) {
                problem(path, "block \(index) failed authentication")
            } catch {
                problem(path, "\(error)")
                return
            }
            offset += Int64(chunk)
            summary.bytes += Int64(chunk)
            if summary.bytes % (64 << 20) == 0 { progress(summary) }
        }
        progress(summary)
    }

    private func checkXattrs(_ procPath: String, path: String) {
        guard let list = try? Sys.listXattrs(procPath) else { return }
        for backing in list where backing.hasPrefix(XattrCodec.backingPrefix) {
            guard xattrs.plaintextName(ofBacking: backing) != nil else {
                problem(path, "xattr name failed authentication", backingName: backing)
                continue
            }
            do {
                _ = try xattrs.openValue(try Sys.getXattr(procPath, backing), backingName: backing)
            } catch {
                problem(path, "value of an xattr failed authentication")
            }
        }
    }
}
