// TempDirectory gives each test a fresh directory under /tmp, removed afterwards.
import CofferSystem
import Foundation
import Glibc

public final class TempDirectory {
    public let path: String
    public let fd: Int32

    public init() {
        var template = Array("/tmp/coffer-test-XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
        fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)
    }

    deinit {
        close(fd)
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Opens (creating) a file in the directory for reading and writing.
    public func openFile(_ name: String) -> Int32 {
        open(path + "/" + name, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    }

    public func read(_ name: String) -> [UInt8] { Array(FileManager.default.contents(atPath: path + "/" + name) ?? Data()) }

    public func write(_ name: String, _ bytes: [UInt8]) {
        let made = FileManager.default.createFile(atPath: path + "/" + name, contents: Data(bytes))
        precondition(made, "cannot write \(name) in the test directory")
    }

    /// Every regular file below the directory, recursively.
    public func allFiles() -> [String] {
        (FileManager.default.enumerator(atPath: path)?.allObjects as? [String] ?? []).map { path + "/" + $0 }
    }
}
