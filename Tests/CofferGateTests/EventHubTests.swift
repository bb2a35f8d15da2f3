// Unit tests of EventHub without a mount or a control server: each subscriber is a socket
// pair whose program end the test holds. A subscriber that does not read is dropped and
// holds up neither the hub, the others nor a lock; `done` ends the wait before a lock and
// the deadline ends it without; stop sends what was published, then the end; the hub
// never closes a descriptor a publish still uses, so nothing it does lands on a socket
// that took the number. And the events' objects, byte for byte.
import CofferSystem
@testable import CofferGate
import Dispatch
import Foundation
import Glibc
import Synchronization
import XCTest

/// The program's end of a subscription, and the number of the hub's end (the hub owns it).
final class SubscriberProgram: Sendable {
    let fd: Int32
    let hubSide: Int32
    private let isOpen = Atomic<Bool>(true)

    init(fd: Int32, hubSide: Int32) {
        self.fd = fd
        self.hubSide = hubSide
    }

    /// Closes the program's end: the hub reads the end of the stream.
    func hangUp() {
        if isOpen.exchange(false, ordering: .relaxed) { close(fd) }
    }

    deinit { hangUp() }
}

/// What the hub's listeners were given, in order.
final class ListenerRecord: Sendable {
    private let events = Mutex<[MountEvent]>([])
    func record(_ event: MountEvent) { events.withLock { $0.append(event) } }
    var all: [MountEvent] { events.withLock { $0 } }
}

final class EventHubTests: XCTestCase {
    var hub: EventHub!

    override func setUpWithError() throws {
        // As in the daemon: a peer that hangs up must not kill the process.
        signal(SIGPIPE, SIG_IGN)
        hub = try EventHub()
    }

    override func tearDown() {
        hub.stop()
        hub = nil
    }

    /// A subscriber: the hub takes one end of a new socket pair, the test keeps the other.
    func subscribe(delays: Bool = false) throws -> SubscriberProgram {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { throw Errno(errno, "socketpair") }
        hub.add(FileDescriptor(owning: fds[0]), delays: delays)
        return SubscriberProgram(fd: fds[1], hubSide: fds[0])
    }

    /// The next event `program` reads, within 5 s.
    func nextEvent(_ program: SubscriberProgram) throws -> Event {
        let body = try Frames.readFrame(program.fd, by: Deadline(seconds: 5))
        return try JSONDecoder().decode(Event.self, from: Data(body))
    }

    /// Sends `{"op": "done"}` from `program`, in two writes 50 ms apart with `inParts`.
    func sayDone(_ program: SubscriberProgram, inParts: Bool = false) {
        let frame = Frames.encode(["op": "done"])
        guard inParts else { return XCTAssertTrue(Frames.write(program.fd, frame)) }
        XCTAssertTrue(Frames.write(program.fd, Array(frame.prefix(3))))
        usleep(50_000)
        XCTAssertTrue(Frames.write(program.fd, Array(frame.dropFirst(3))))
    }

    /// Fills the buffer of the hub's end of `program`, as a program that stopped reading
    /// long ago would have: the next frame does not fit.
    func fill(_ program: SubscriberProgram) {
        let junk = [UInt8](repeating: 0x2a, count: 4096)
        while send(program.hubSide, junk, junk.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) > 0 {}
    }

    /// Whether `program` reads the end of its stream within `seconds` (what is there
    /// before it is read and thrown away).
    func seesTheEnd(_ program: SubscriberProgram, within seconds: Double) -> Bool {
        let deadline = Deadline(seconds: seconds)
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            var ready = [pollfd(fd: program.fd, events: Int16(POLLIN), revents: 0)]
            guard poll(&ready, 1, deadline.remainingMilliseconds) > 0 else { return false }
            let n = recv(program.fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) { return true }
        }
    }

    /// Whether `condition` holds within `seconds`.
    func eventually(within seconds: Double = 5, _ condition: () -> Bool) -> Bool {
        let end = Sys.monotonicNow() + seconds
        while !condition() {
            if Sys.monotonicNow() >= end { return false }
            usleep(10_000)
        }
        return true
    }

    /// Seconds `body` took.
    func elapsed(_ body: () -> Void) -> Double {
        let start = Sys.monotonicNow()
        body()
        return Sys.monotonicNow() - start
    }

    // MARK: A subscriber that does not read

    func testASubscriberThatDoesNotReadIsDroppedAndHoldsUpNothing() throws {
        let reader = try subscribe()
        let deaf = try subscribe(delays: true)
        XCTAssertEqual(hub.count, 2)
        fill(deaf)

        let publishing = elapsed { hub.publish(MountEvent(.willLock(.idle, grace: 30))) }
        XCTAssertLessThan(publishing, 1, "a full socket does not hold up the publisher")
        XCTAssertEqual(hub.count, 1, "dropped by the send that did not fit")
        XCTAssertLessThan(elapsed { hub.waitForDone(until: Sys.monotonicNow() + 10) }, 1,
                          "a dropped subscriber that asked for time holds up no lock")

        let heard = try nextEvent(reader)
        XCTAssertEqual(heard.event, "will-lock")
        XCTAssertEqual(heard.reason, "idle")
        XCTAssertEqual(heard.graceSeconds, 30)
        hub.publish(MountEvent(.locked(.idle)))
        XCTAssertEqual(try nextEvent(reader).event, "locked", "the others go on hearing every event")
        XCTAssertTrue(seesTheEnd(deaf, within: 5), "the dropped one's connection is shut down")
        XCTAssertEqual(hub.count, 1)
    }

    // MARK: The grace before a lock

    func testDoneEndsTheWaitForALockAndTheDeadlineEndsItWithout() throws {
        let saves = try subscribe(delays: true)
        let stalls = try subscribe(delays: true)
        let plain = try subscribe()
        let everyone = [saves, stalls, plain]
        XCTAssertLessThan(elapsed { hub.waitForDone(until: Sys.monotonicNow() + 10) }, 1, "no will-lock yet: nobody is waited for")

        // Both that asked for time say done (one frame in two parts): the wait ends then.
        hub.publish(MountEvent(.willLock(.command, grace: 10)))
        for program in everyone { XCTAssertEqual(try nextEvent(program).event, "will-lock") }
        sayDone(saves, inParts: true)
        sayDone(stalls)
        XCTAssertLessThan(elapsed { hub.waitForDone(until: Sys.monotonicNow() + 10) }, 2, "done from each ends the grace early")

        // One says nothing: the wait lasts to the deadline, and no longer.
        hub.publish(MountEvent(.willLock(.idle, grace: 1)))
        for program in everyone { _ = try nextEvent(program) }
        sayDone(saves)
        let held = elapsed { hub.waitForDone(until: Sys.monotonicNow() + 1) }
        XCTAssertGreaterThanOrEqual(held, 0.9, "a done before this will-lock does not count")
        XCTAssertLessThan(held, 2, "no subscriber holds a lock past its deadline")

        // One hangs up: it holds nothing.
        hub.publish(MountEvent(.willLock(.idle, grace: 10)))
        for program in everyone { _ = try nextEvent(program) }
        sayDone(saves)
        stalls.hangUp()
        XCTAssertLessThan(elapsed { hub.waitForDone(until: Sys.monotonicNow() + 10) }, 2, "a subscriber gone holds no lock")
        XCTAssertTrue(eventually { hub.count == 2 })
    }

    // MARK: The end

    func testStopSendsWhatWasPublishedThenTheEnd() throws {
        let programs = try (0..<3).map { _ in try subscribe() }
        hub.publish(MountEvent(.locked(.unmount)))
        hub.publish(MountEvent(.unmounting))
        hub.stop()
        for program in programs {
            XCTAssertEqual(try nextEvent(program).event, "locked")
            XCTAssertEqual(try nextEvent(program).event, "unmounting")
            XCTAssertTrue(seesTheEnd(program, within: 2), "stop ends every subscription")
        }
        let late = try subscribe()
        XCTAssertTrue(seesTheEnd(late, within: 2), "a subscriber after the end is ended at once")
        XCTAssertEqual(hub.count, 0)
        hub.publish(MountEvent(.unlocked))
    }

    // MARK: Descriptors

    /// The race the hub had: a publish took the subscribers' descriptor numbers under its
    /// lock and sent after leaving it; meanwhile the reading thread closed one that had
    /// hung up, and the next socket of the daemon (an accepted control connection) could
    /// take the number before the publish sent its frame or its shutdown there. Here a
    /// listener holds a publish after its sends, while the subscriber it found full hangs
    /// up: the hub must keep that descriptor open until the publish is done with it, and
    /// nothing the publish does may reach a socket that took the number.
    func testADescriptorIsNotClosedWhileAPublishUsesItNorItsNumberReached() throws {
        let events = hub!
        let full = try subscribe()
        fill(full)
        let inListener = DispatchSemaphore(value: 0), goOn = DispatchSemaphore(value: 0)
        let published = DispatchSemaphore(value: 0)
        events.listen { _ in
            inListener.signal()
            goOn.wait()
        }
        DispatchQueue.global().async {
            events.publish(MountEvent(.unlocked))
            published.signal()
        }
        XCTAssertEqual(inListener.wait(timeout: .now() + 5), .success)

        // The program hangs up: the reading thread sees the end and lets go of it.
        full.hangUp()
        let closedMeanwhile = eventually(within: 1) { fcntl(full.hubSide, F_GETFD) == -1 }
        // Where the number is free, a new connection takes it, as accept(2) would.
        var newcomer: [Int32] = [-1, -1]
        if closedMeanwhile {
            XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &newcomer), 0)
            XCTAssertEqual(dup2(newcomer[0], full.hubSide), full.hubSide)
            close(newcomer[0])
        }
        goOn.signal()
        XCTAssertEqual(published.wait(timeout: .now() + 5), .success)

        XCTAssertFalse(closedMeanwhile, "the hub closed a descriptor that a publish still held")
        if closedMeanwhile {
            var byte: UInt8 = 0
            let n = recv(newcomer[1], &byte, 1, Int32(MSG_DONTWAIT))
            XCTAssertTrue(n < 0 && errno == EAGAIN,
                          "the connection that took the number got \(n == 0 ? "a shutdown" : "a frame") meant for a subscriber")
            close(full.hubSide)
            close(newcomer[1])
        } else {
            XCTAssertTrue(eventually { fcntl(full.hubSide, F_GETFD) == -1 }, "closed once the publish let go of it")
        }
        XCTAssertEqual(events.count, 0)
    }

    // MARK: The events

    func testListenersGetTheTypedEventAfterTheSubscribers() throws {
        let program = try subscribe()
        let record = ListenerRecord()
        hub.listen { record.record($0) }
        let at = Date(timeIntervalSince1970: 1_795_703_390.25)
        let announced = MountEvent(.willLock(.screen, grace: 5), at: at)
        hub.publish(announced)
        XCTAssertEqual(record.all, [announced], "the listener gets the event itself, to the microsecond")
        XCTAssertEqual(announced.deadline, at.addingTimeInterval(5))
        let sent = try nextEvent(program)
        XCTAssertEqual(sent.at, "2026-11-26T14:29:50Z", "the socket's text has whole seconds")
        XCTAssertEqual(sent.deadline, "2026-11-26T14:29:55Z")
    }

    /// The objects subscribers read, as docs/CONTROL.md shows them (keys sorted, no spaces).
    func testEventObjectsOnTheSocketByteForByte() throws {
        let at = Date(timeIntervalSince1970: 1_795_703_390)  // 2026-11-26T14:29:50Z
        func wire(_ change: MountEvent.Change) -> String {
            String(decoding: Frames.encode(Event(MountEvent(change, at: at))).dropFirst(4), as: UTF8.self)
        }
        XCTAssertEqual(wire(.willLock(.idle, grace: 30)),
                       #"{"at":"2026-11-26T14:29:50Z","deadline":"2026-11-26T14:30:20Z","event":"will-lock","events":1,"graceSeconds":30,"reason":"idle"}"#)
        XCTAssertEqual(wire(.willLock(.command, grace: 0)),
                       #"{"at":"2026-11-26T14:29:50Z","deadline":"2026-11-26T14:29:50Z","event":"will-lock","events":1,"graceSeconds":0,"reason":"command"}"#)
        XCTAssertEqual(wire(.locked(.unmount)), #"{"at":"2026-11-26T14:29:50Z","event":"locked","events":1,"reason":"unmount"}"#)
        XCTAssertEqual(wire(.unlocked), #"{"at":"2026-11-26T14:29:50Z","event":"unlocked","events":1}"#)
        XCTAssertEqual(wire(.unmounting), #"{"at":"2026-11-26T14:29:50Z","event":"unmounting","events":1}"#)

        let damage = Event(MountEvent(.damage(path: "/photos/a.jpg", what: "block 3 failed authentication"), at: at))
        let decoded = try JSONDecoder().decode(Event.self, from: Data(Frames.encode(damage).dropFirst(4)))
        XCTAssertEqual(decoded, damage)
        XCTAssertEqual(decoded.event, "damage")
        XCTAssertEqual(decoded.path, "/photos/a.jpg")
        XCTAssertEqual(decoded.what, "block 3 failed authentication")
        XCTAssertNil(decoded.reason)
        XCTAssertNil(decoded.deadline)
        XCTAssertNil(decoded.graceSeconds)
        let conflict = Event(MountEvent(.conflict(path: "/notes/todo.sync-conflict-20261126-150301-ABCDEFG.txt"), at: at))
        XCTAssertEqual(conflict.event, "conflict")
        XCTAssertEqual(conflict.path, "/notes/todo.sync-conflict-20261126-150301-ABCDEFG.txt")
        XCTAssertNil(conflict.what)
    }
}
