// Tests of reading a backing directory: an entry's name is read in place, never past the
// entry's end, and a directory of many names of every length lists whole.
import CofferSystem
import Foundation
import Glibc
import XCTest

final class DirectoryEntryTests: XCTestCase {
    /// A short entry laid out as the kernel lays it, ending where a readable page ends and
    /// an unreadable one begins: reading more than the name (the 256 bytes Swift imports
    /// `d_name` as) faults.
    func testAnEntryEndingAtAPageBoundaryIsReadInPlace() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        guard let area = mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
              area != MAP_FAILED else { throw XCTSkip("mmap failed") }
        defer { munmap(area, 2 * page) }
        XCTAssertEqual(mprotect(area + page, page, PROT_NONE), 0)
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        let length = (nameOffset + 3 + 7) & ~7  // "ab" and its NUL, to 8 bytes as getdents does
        let start = area + page - length
        start.initializeMemory(as: UInt8.self, repeating: 0, count: length)
        start.storeBytes(of: UInt64(4242), as: UInt64.self)  // d_ino
        start.storeBytes(of: UInt16(length), toByteOffset: 16, as: UInt16.self)  // d_reclen
        start.storeBytes(of: UInt8(DT_REG), toByteOffset: 18, as: UInt8.self)  // d_type
        start.storeBytes(of: UInt8(ascii: "a"), toByteOffset: nameOffset, as: UInt8.self)
        start.storeBytes(of: UInt8(ascii: "b"), toByteOffset: nameOffset + 1, as: UInt8.self)
        let entry = Sys.DirectoryEntry(UnsafeRawPointer(start).assumingMemoryBound(to: dirent.self))
        XCTAssertEqual(entry.name, "ab")
        XCTAssertEqual(entry.ino, 4242)
        XCTAssertEqual(entry.type, UInt8(DT_REG))
    }

    /// 2,000 names of 1 to 255 bytes: glibc's 32 KiB buffer ends mid-listing many times.
    func testADirectoryOfNamesOfEveryLengthListsWhole() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("coffer-dirent-\(getpid())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: dir) }
        var expected: Set<String> = []
        for i in 0..<2000 {
            let stem = String(i)
            let name = stem + String(repeating: "x", count: max(0, 1 + i % 255 - stem.count))
            expected.insert(name)
            XCTAssertTrue(FileManager.default.createFile(atPath: dir.appendingPathComponent(name).path, contents: nil))
        }
        let fd = try FileDescriptor.open(dir.path, flags: O_RDONLY | O_DIRECTORY)
        let listed = try Sys.readDirectory(fd.rawValue)
        XCTAssertEqual(Set(listed.map(\.name)), expected)
        XCTAssertEqual(listed.count, expected.count)
        XCTAssertTrue(listed.allSatisfy { $0.type == UInt8(DT_REG) })
    }
}
