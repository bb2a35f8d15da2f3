// Tests of FileDescriptor's ownership: a descriptor is closed when its owner goes out
// of scope, and not when ownership was given up; a pipe's ends are closed one by one.
import CofferSystem
import Foundation
import Glibc
import XCTest

final class FileDescriptorTests: XCTestCase {
    /// Entries of /proc/self/fd (the listing itself holds one more while it runs).
    func openDescriptors() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1 }

    func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) >= 0 }

    func testADescriptorClosesWhenItsOwnerGoesOutOfScope() throws {
        let before = openDescriptors()
        var number: Int32 = -1
        do {
            let fd = try FileDescriptor.open("/", flags: O_RDONLY | O_DIRECTORY)
            number = fd.rawValue
            XCTAssertTrue(isOpen(number))
            XCTAssertEqual(openDescriptors(), before + 1)
        }
        XCTAssertFalse(isOpen(number), "closed at the end of its scope")
        XCTAssertEqual(openDescriptors(), before)
    }

    func testAReleasedDescriptorStaysOpen() throws {
        let before = openDescriptors()
        var number: Int32 = -1
        do {
            let fd = try FileDescriptor.open("/", flags: O_RDONLY | O_DIRECTORY)
            number = fd.release()
        }
        XCTAssertTrue(isOpen(number), "ownership was given up: nothing closed it")
        XCTAssertEqual(openDescriptors(), before + 1)
        Sys.close(number)
        XCTAssertEqual(openDescriptors(), before)
    }

    func testAFailedOpenLeavesNothingOpen() throws {
        let before = openDescriptors()
        XCTAssertThrowsError(try FileDescriptor.openRegular("/").close()) { XCTAssertEqual(($0 as? Errno)?.code, EINVAL) }
        XCTAssertEqual(openDescriptors(), before, "the directory opened before the refusal was closed")
    }

    func testReopenDirectoryReachesTheSameDirectory() throws {
        let root = try FileDescriptor.open("/", flags: O_RDONLY | O_DIRECTORY)
        let again = try root.reopenDirectory(flags: O_PATH)
        XCTAssertNotEqual(again.rawValue, root.rawValue)
        let a = try Sys.stat(root.rawValue), b = try Sys.stat(again.rawValue)
        XCTAssertEqual(a.st_dev, b.st_dev)
        XCTAssertEqual(a.st_ino, b.st_ino)
    }

    func testClosingOneEndOfAPipeKeepsTheOther() throws {
        let pipe = try Sys.pipe()
        let readEnd = pipe.read.rawValue, writeEnd = pipe.write.rawValue
        try [UInt8(7)].withUnsafeBytes { try Sys.send(writeEnd, $0) }
        pipe.write.close()
        XCTAssertFalse(isOpen(writeEnd))
        XCTAssertTrue(isOpen(readEnd), "the read end is still owned by the pipe")
        var byte: UInt8 = 0
        XCTAssertTrue(withUnsafeMutableBytes(of: &byte) { Sys.receive(readEnd, into: $0) })
        XCTAssertEqual(byte, 7)
        XCTAssertFalse(withUnsafeMutableBytes(of: &byte) { Sys.receive(readEnd, into: $0) }, "end of file: no writer is left")
        pipe.read.close()
        XCTAssertFalse(isOpen(readEnd))
    }
}
