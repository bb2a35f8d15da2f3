// Unit tests of the mount's D-Bus object without a bus (docs/CONTROL.md, "D-Bus"): its
// name, what it answers to each method call, who may lock, and the signals that say a
// lock is coming, came or went, read back as a listener would.
@testable import CofferBus
import Foundation
import Glibc
import XCTest

final class MountObjectTests: XCTestCase {
    var bus: DetachedBus!

    override func setUpWithError() throws {
        bus = try DetachedBus()
    }

    override func tearDown() {
        bus = nil
    }

    func testTheElementThatNamesAMount() {
        XCTAssertEqual(MountObject.element("Private-3f2a1b0c9d8e"), "Private_3f2a1b0c9d8e")
        XCTAssertEqual(MountObject.element("my.vault-1"), "my_vault_1")
        XCTAssertEqual(MountObject.element("a_b"), "a_b")
        XCTAssertEqual(MountObject.element("2024-notes"), "_2024_notes", "no element starts with a digit")
        XCTAssertEqual(MountObject.element("日本"), "__", "anything but ASCII letters, digits and _ is _")
        XCTAssertEqual(MountObject.element(""), "_")
    }

    // MARK: Method calls

    /// The object's answer to `member` of `interface` with `arguments` appended, for a
    /// mount that is locked as `locked` says.
    func answer(_ interface: String, _ member: String, locked: Bool = true,
                _ arguments: (BusMessage) throws -> Void = { _ in }) throws -> MountObject.Answer {
        let call = try bus.methodCall(interface, member, path: MountObject.pathPrefix + "Private_3f2a")
        try arguments(call)
        try bus.sealed(call)
        return try MountObject.answer(call, mountpoint: "/home/alice/Private", vault: "/home/alice/.Private",
                                      isLocked: { locked })
    }

    /// The reply an answer carries, sealed for reading.
    func reply(_ answer: MountObject.Answer, file: StaticString = #filePath, line: UInt = #line) throws -> BusMessage {
        guard case .reply(let reply) = answer else {
            XCTFail("not a reply: \(answer)", file: file, line: line)
            throw BusError("reply", -EINVAL)
        }
        return try bus.sealed(reply)
    }

    /// The D-Bus error an answer carries, nil if it is none.
    func errorName(_ answer: MountObject.Answer) -> String? {
        guard case .error(let name, _) = answer else { return nil }
        return name
    }

    func get(_ property: String, of interface: String = MountObject.interface, locked: Bool = true) throws -> MountObject.Answer {
        try answer("org.freedesktop.DBus.Properties", "Get", locked: locked) {
            try $0.append(interface)
            try $0.append(property)
        }
    }

    func testGetAnswersEachPropertyAndNothingElse() throws {
        for locked in [true, false] {
            let value = try reply(try get("Locked", locked: locked))
            XCTAssertTrue(try value.enter("v", "b"))
            XCTAssertEqual(try value.readBool(), locked)
        }
        for (property, expected) in [("Mountpoint", "/home/alice/Private"), ("Vault", "/home/alice/.Private")] {
            let value = try reply(try get(property))
            XCTAssertTrue(try value.enter("v", "s"))
            XCTAssertEqual(try value.readString(), expected, property)
        }
        XCTAssertEqual(errorName(try get("Unlock")), "org.freedesktop.DBus.Error.UnknownProperty")
        XCTAssertEqual(errorName(try get("Locked", of: "org.example.Other")), "org.freedesktop.DBus.Error.UnknownProperty")
        XCTAssertThrowsError(try answer("org.freedesktop.DBus.Properties", "Get"), "no arguments: InvalidArgs")
    }

    func testGetAllListsTheThreePropertiesOfItsInterfaceOnly() throws {
        let all = try reply(try answer("org.freedesktop.DBus.Properties", "GetAll", locked: false) {
            try $0.append(MountObject.interface)
        })
        XCTAssertTrue(try all.enter("a", "{sv}"))
        var seen: [String] = []
        while try all.enter("e", "sv") {
            let name = try all.readString()
            seen.append(name)
            if name == "Locked" {
                XCTAssertTrue(try all.enter("v", "b"))
                XCTAssertEqual(try all.readBool(), false)
            } else {
                XCTAssertTrue(try all.enter("v", "s"))
                XCTAssertEqual(try all.readString(), name == "Mountpoint" ? "/home/alice/Private" : "/home/alice/.Private")
            }
            try all.exit()
            try all.exit()
        }
        try all.exit()
        XCTAssertEqual(seen, ["Locked", "Mountpoint", "Vault"])
        XCTAssertEqual(seen, MountObject.properties)

        let other = try reply(try answer("org.freedesktop.DBus.Properties", "GetAll") { try $0.append("org.example.Other") })
        XCTAssertTrue(try other.enter("a", "{sv}"))
        XCTAssertFalse(try other.enter("e", "sv"), "another interface has no properties here")
    }

    func testPropertiesAreReadOnly() throws {
        let refusal = try answer("org.freedesktop.DBus.Properties", "Set") {
            try $0.append(MountObject.interface)
            try $0.append("Locked")
            try $0.open("v", "b")
            try $0.append(false)
            try $0.close()
        }
        XCTAssertEqual(errorName(refusal), "org.freedesktop.DBus.Error.PropertyReadOnly")
    }

    func testLockIsHandedOnWithItsGraceAndUnknownMethodsAreLeftToSdBus() throws {
        for grace in [true, false] {
            let call = try answer(MountObject.interface, "Lock") { try $0.append(grace) }
            guard case .lock(let asked) = call else { return XCTFail("Lock(\(grace)) is not a lock") }
            XCTAssertEqual(asked, grace)
        }
        XCTAssertThrowsError(try answer(MountObject.interface, "Lock"), "Lock without its argument: InvalidArgs")
        guard case .unknown = try answer(MountObject.interface, "Unlock") else {
            return XCTFail("no Unlock on the bus: a secret never travels through it")
        }
    }

    func testOnlyTheOwnerAndRootMayLock() {
        XCTAssertTrue(MountObject.mayLock(1000, owner: 1000))
        XCTAssertTrue(MountObject.mayLock(0, owner: 1000))
        XCTAssertFalse(MountObject.mayLock(1001, owner: 1000))
        XCTAssertFalse(MountObject.mayLock(1000, owner: 0), "a root mount is locked by root alone")
    }

    func testIntrospectionDescribesTheInterfaceAnswered() throws {
        let xml = try reply(try answer("org.freedesktop.DBus.Introspectable", "Introspect"))
        XCTAssertEqual(try xml.readString(), MountObject.introspection)
        let text = MountObject.introspection
        XCTAssertTrue(text.contains("<interface name=\"\(MountObject.interface)\">"))
        for property in MountObject.properties {
            XCTAssertTrue(text.contains("<property name=\"\(property)\" type=\"\(property == "Locked" ? "b" : "s")\" access=\"read\">"), property)
        }
        for member in ["<signal name=\"WillLock\">", "<signal name=\"Locked\">", "<signal name=\"Unlocked\"/>", "<method name=\"Lock\">"] {
            XCTAssertTrue(text.contains(member), member)
        }
    }

    // MARK: Signals

    /// The signals that say `change`, each made and filled as `announce` does, sealed.
    func signals(_ change: MountObject.Change) throws -> [BusMessage] {
        try MountObject.signals(for: change).map { signal -> BusMessage in
            let message = try bus.signal(signal.interface, signal.member, path: MountObject.pathPrefix + "Private_3f2a")
            try signal.fill(message)
            return try bus.sealed(message)
        }
    }

    func testWillLockSaysTheDeadlineInMicrosecondsSinceTheEpoch() throws {
        let deadline = Date(timeIntervalSince1970: 1_795_703_420.25)
        let sent = try signals(.willLock(reason: "idle", grace: 30, deadline: deadline))
        XCTAssertEqual(sent.map(\.member), ["WillLock"])
        XCTAssertEqual(sent[0].interface, MountObject.interface)
        XCTAssertEqual(try sent[0].readString(), "idle")
        XCTAssertEqual(try sent[0].readDouble(), 30)
        XCTAssertEqual(try sent[0].readUInt64(), 1_795_703_420_250_000)
        XCTAssertThrowsError(try sent[0].readString(), "three arguments")
        XCTAssertEqual(MountObject.microseconds(Date(timeIntervalSince1970: -5)), 0)
    }

    func testALockAndAnUnlockAlsoChangeTheLockedProperty() throws {
        for (change, member, locked) in [(MountObject.Change.locked(reason: "screen"), "Locked", true),
                                         (MountObject.Change.unlocked, "Unlocked", false)] {
            let sent = try signals(change)
            XCTAssertEqual(sent.map(\.member), [member, "PropertiesChanged"])
            XCTAssertEqual(sent.map(\.interface), [MountObject.interface, "org.freedesktop.DBus.Properties"])
            if locked {
                XCTAssertEqual(try sent[0].readString(), "screen")
            }
            XCTAssertThrowsError(try sent[0].readString(), "\(member): no more arguments")

            let changed = sent[1]
            XCTAssertEqual(try changed.readString(), MountObject.interface)
            XCTAssertTrue(try changed.enter("a", "{sv}"))
            XCTAssertTrue(try changed.enter("e", "sv"))
            XCTAssertEqual(try changed.readString(), "Locked")
            XCTAssertTrue(try changed.enter("v", "b"))
            XCTAssertEqual(try changed.readBool(), locked)
            try changed.exit()
            try changed.exit()
            XCTAssertFalse(try changed.enter("e", "sv"), "Locked alone changed")
            try changed.exit()
            XCTAssertTrue(try changed.enter("a", "s"))
            XCTAssertThrowsError(try changed.readString(), "none invalidated")
        }
    }
}
