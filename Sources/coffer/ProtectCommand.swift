// ProtectCommand sets and shows a directory's protection class in a mounted, unlocked
// vault: `coffer protect --class unless-open PATH`, `coffer protect --show PATH`. It
// only calls setxattr/getxattr of `user.coffer.class` on PATH; the daemon does the rest.
import ArgumentParser
import CofferSystem
import CofferVault
import Foundation
import Glibc

struct ProtectCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "protect",
        abstract: "Set or show a directory's protection class (what a lock does to its files).",
        discussion: """
            complete (the default): at a lock every file is refused. unless-open: a file open \
            at the lock stays usable through its open descriptors until it is closed, and new \
            files and directories can be made in it while locked (sealed to the vault's drop \
            key; ordinary entries again from the unlock). after-first-unlock (format 8): its files and names stay usable \
            through `coffer lock` (not `lock --all`). A new directory takes its parent's class. The vault must be \
            unlocked and of format 6 (format 8 for after-first-unlock); \
            only the directory's owner (or root) sets its class. The same as \
            `setfattr -n user.coffer.class -v CLASS PATH` and `getfattr -n user.coffer.class PATH`.
            """)

    @Option(name: .customLong("class"), help: ArgumentHelp("The class to set: complete, unless-open or after-first-unlock.", valueName: "class"))
    var protectionClass: String?

    @Flag(name: .long, help: "Show the directory's class (the default without --class).")
    var show = false

    @Flag(name: [.customShort("R"), .long], help: "With --class: set it on every directory below PATH too (new ones take it anyway).")
    var recursive = false

    @Argument(help: "A directory in a mounted coffer vault.")
    var path: String

    func validate() throws {
        if let protectionClass, ProtectionClass(name: protectionClass) == nil {
            throw ValidationError("--class must be complete, unless-open or after-first-unlock, not \(protectionClass)")
        }
        if show && protectionClass != nil { throw ValidationError("--show and --class go alone") }
        if recursive && protectionClass == nil { throw ValidationError("--recursive goes with --class") }
    }

    func run() throws {
        try runReportingFailures {
            try checkInMount()
            do {
                if let protectionClass {
                    let all = recursive ? try directories(below: path) : [path]
                    // A class change between key domains moves each directory's entries: a
                    // large tree takes a while, so a terminal sees how far it got.
                    let progress = all.count > 1 && isatty(STDERR_FILENO) == 1
                    for (done, directory) in all.enumerated() {
                        try Sys.setXattr(directory, "user.coffer.class", Array(protectionClass.utf8), flags: 0)
                        if progress { FileHandle.standardError.write(Data("\r\(done + 1) of \(all.count) directories".utf8)) }
                    }
                    if progress { FileHandle.standardError.write(Data("\n".utf8)) }
                    print("\(path)\(recursive ? " and every directory below" : ""): \(protectionClass)")
                } else {
                    print("\(path): \(String(decoding: try Sys.getXattr(path, "user.coffer.class"), as: UTF8.self))")
                }
            } catch let error as Errno {
                throw failure(error.code)
            }
        }
    }

    /// `root` and every directory below it (symlinks not followed), parents first.
    private func directories(below root: String) throws -> [String] {
        var found = [root], index = 0
        while index < found.count {
            let dir = found[index]
            index += 1
            let fd = try FileDescriptor.open(dir, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
            for entry in try Sys.readDirectory(fd.rawValue) where entry.type == UInt8(DT_DIR) {
                found.append(dir + "/" + entry.name)
            }
        }
        return found
    }

    /// PATH must be a directory of a coffer mount.
    private func checkInMount() throws {
        guard let canonical = MountPoint.canonical(path) else {
            throw CommandFailure(status: .notADirectory, message: "\(path) does not exist")
        }
        let inCoffer = MountPoint.mounts().filter { canonical == $0.path || canonical.hasPrefix($0.path == "/" ? "/" : $0.path + "/") }
            .max { $0.path.count < $1.path.count }?.type == "fuse.coffer"
        guard inCoffer else { throw CommandFailure(status: .notMounted, message: "\(path) is not in a mounted coffer vault") }
    }

    /// The failure of setxattr/getxattr with `code`, in the statuses of docs/guide/exit-statuses.md.
    private func failure(_ code: Int32) -> CommandFailure {
        switch code {
        case EACCES:
            return CommandFailure(status: .locked, message: "\(path): the vault is locked (or you may not read this directory); unlock it first")
        case EOPNOTSUPP, ENODATA:
            return CommandFailure(status: .unsupported,
                                  message: "\(path): this vault's format has no protection classes "
                                      + "(format 6 has them: a vault made by `coffer init` of this version)")
        case EINVAL where protectionClass.flatMap(ProtectionClass.init(name:)) == .afterFirstUnlock:
            return CommandFailure(status: .unsupported,
                                  message: "\(path): this vault's format has no after-first-unlock class "
                                      + "(format 8 has it: a vault made by `coffer init --format 8`)")
        case EMLINK:
            return CommandFailure(status: .classChangeRefused,
                                  message: "\(path): a file in it has more than one hard link, and its other links would stay "
                                      + "in the other key domain; nothing was changed")
        case EXDEV:
            return CommandFailure(status: .classChangeRefused,
                                  message: "\(path): a file in it was made while locked and keeps its key in its key record; nothing was changed")
        case ENOTDIR:
            return CommandFailure(status: .notADirectory, message: "\(path) is not a directory: a protection class is a directory's")
        case EPERM:
            return CommandFailure(status: .requestRefused, message: "\(path): only the directory's owner or root may set its protection class")
        default:
            return CommandFailure(status: .failure, message: "\(path): \(String(cString: strerror(code)))")
        }
    }
}
