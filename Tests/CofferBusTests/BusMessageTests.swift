// Unit tests of BusMessage and of how SessionLock reads logind's messages, without a bus:
// values appended and read back, reading where there is no value, ListSessions' replies
// and a session's PropertiesChanged.
@testable import CofferBus
import Foundation
import Glibc
import XCTest

final class BusMessageTests: XCTestCase {
    var bus: DetachedBus!

    override func setUpWithError() throws {
        bus = try DetachedBus()
    }

    override func tearDown() {
        bus = nil
    }

    func testValuesAndContainersReadBackAsAppended() throws {
        let message = try bus.signal("io.github.coffer.Test", "Values")
        try message.append("text")
        try message.append(objectPath: "/org/freedesktop/login1/session/_31")
        try message.append(true)
        try message.append(2.5)
        try message.append(UInt64(1) << 40)
        try message.open("a", "{sv}")
        try message.open("e", "sv")
        try message.append("LockedHint")
        try message.open("v", "b")
        try message.append(false)
        try message.close()
        try message.close()
        try message.close()
        try bus.sealed(message)

        XCTAssertEqual(message.interface, "io.github.coffer.Test")
        XCTAssertEqual(message.member, "Values")
        XCTAssertEqual(message.path, "/test")
        XCTAssertEqual(try message.readString(), "text")
        XCTAssertEqual(try message.readString(objectPath: true), "/org/freedesktop/login1/session/_31")
        XCTAssertEqual(try message.readBool(), true)
        XCTAssertEqual(try message.readDouble(), 2.5)
        XCTAssertEqual(try message.readUInt64(), UInt64(1) << 40)
        XCTAssertTrue(try message.enter("a", "{sv}"))
        XCTAssertTrue(try message.enter("e", "sv"))
        XCTAssertEqual(try message.readString(), "LockedHint")
        XCTAssertTrue(try message.enter("v", "b"))
        XCTAssertEqual(try message.readBool(), false)
        try message.exit()
        try message.exit()
        XCTAssertFalse(try message.enter("e", "sv"), "the array has one entry")
        try message.exit()
        XCTAssertThrowsError(try message.readString(), "past the last argument")
    }

    /// sd-bus answers 0 (not an error) for a read at the end of an array: each read
    /// throws there instead of returning nothing (a string read there used to trap).
    func testReadingAtTheEndOfAnArrayThrows() throws {
        let message = try bus.signal("io.github.coffer.Test", "Array")
        try message.open("a", "s")
        try message.append("one")
        try message.close()
        try message.open("a", "u")
        try message.close()
        try bus.sealed(message)

        XCTAssertTrue(try message.enter("a", "s"))
        XCTAssertEqual(try message.readString(), "one")
        XCTAssertThrowsError(try message.readString())
        try message.exit()
        XCTAssertTrue(try message.enter("a", "u"), "an empty array is entered")
        XCTAssertThrowsError(try message.readUInt32())
        XCTAssertThrowsError(try message.readBool())
        try message.exit()
    }

    func testAWrongTypeIsAnError() throws {
        let message = try bus.signal("io.github.coffer.Test", "Typed")
        try message.append(uint32: 7)
        try bus.sealed(message)
        XCTAssertThrowsError(try message.readString())
        XCTAssertEqual(try message.readUInt32(), 7, "a refused read leaves the value to read")
    }

    // MARK: logind's messages (SessionLock)

    /// A ListSessions reply's arguments: a(susso) — id, uid, user, seat, object path.
    func sessionList(_ sessions: [(id: String, uid: UInt32, user: String, path: String)]) throws -> BusMessage {
        let message = try bus.methodCall("org.freedesktop.login1.Manager", "ListSessions")
        try message.open("a", "(susso)")
        for session in sessions {
            try message.open("r", "susso")
            try message.append(session.id)
            try message.append(uint32: session.uid)
            try message.append(session.user)
            try message.append("seat0")
            try message.append(objectPath: session.path)
            try message.close()
        }
        try message.close()
        return try bus.sealed(message)
    }

    func testListSessionsGivesEachSessionsUidAndPath() throws {
        let reply = try sessionList([
            ("2", 1000, "alice", "/org/freedesktop/login1/session/_32"),
            ("c1", 0, "root", "/org/freedesktop/login1/session/c1"),
        ])
        let sessions = try SessionLock.sessions(of: reply).map { "\($0.uid) \($0.path)" }
        XCTAssertEqual(sessions, ["1000 /org/freedesktop/login1/session/_32", "0 /org/freedesktop/login1/session/c1"])
        XCTAssertEqual(try SessionLock.sessions(of: try sessionList([])).count, 0)
    }

    /// A session's PropertiesChanged: its interface, the changed properties, none invalidated.
    func propertiesChanged(_ changed: [(String, Any)]) throws -> BusMessage {
        let message = try bus.signal("org.freedesktop.DBus.Properties", "PropertiesChanged",
                                     path: "/org/freedesktop/login1/session/_32")
        try message.append("org.freedesktop.login1.Session")
        try message.open("a", "{sv}")
        for (name, value) in changed {
            try message.open("e", "sv")
            try message.append(name)
            if let flag = value as? Bool {
                try message.open("v", "b")
                try message.append(flag)
            } else {
                try message.open("v", "s")
                try message.append("\(value)")
            }
            try message.close()
            try message.close()
        }
        try message.close()
        try message.open("a", "s")
        try message.close()
        return try bus.sealed(message)
    }

    func testOnlyLockedHintTurningTrueIsAScreenLock() throws {
        XCTAssertTrue(try SessionLock.lockedHintTurnsTrue(try propertiesChanged([("Active", true), ("LockedHint", true)])))
        XCTAssertTrue(try SessionLock.lockedHintTurnsTrue(try propertiesChanged([("Name", "tty2"), ("LockedHint", true)])))
        XCTAssertFalse(try SessionLock.lockedHintTurnsTrue(try propertiesChanged([("LockedHint", false)])))
        XCTAssertFalse(try SessionLock.lockedHintTurnsTrue(try propertiesChanged([("Active", true), ("Name", "tty2")])))
        XCTAssertFalse(try SessionLock.lockedHintTurnsTrue(try propertiesChanged([])))
    }
}
