// KeyGate holds the keys while the view is open and counts the operations running with
// them. An operation's path is two atomic loads and two atomic read-modify-writes (no
// Mutex: every request passes here); only a close, and the last operation out while a
// close waits, take a Mutex, to find the semaphore of the wait. One close at a time
// (PlainFileSystem.lock runs in the Gate's turn).
//
// One word holds the state: bit 0 is set while the view is open, bit 1 while a close
// waits for the operations in flight, and the rest counts them (4 each). The value
// lives in a box reached through an atomic pointer, which holds one retain of its own:
//
// - `enter` counts itself in first, and reads the pointer only if it then sees the view
//   open; `close` clears the open bit first and releases the box only once it has seen
//   the count at zero. So a box is never released while an operation may still be about
//   to retain it.
// - If the count does not drain within the bound (an operation stuck in a hung backing
//   file system), the box is left unreleased: its memory outlives the stuck operation,
//   at the cost of a few bytes per such lock. The value's secrets are wiped by the
//   caller all the same (see PlainFileSystem.lock).
import Dispatch
import Synchronization

final class KeyGate<Value: Sendable>: Sendable {
    private final class Box: Sendable {
        let value: Value
        init(_ value: Value) { self.value = value }
    }

    private static var open: Int { 1 }
    private static var waiting: Int { 2 }
    private static var one: Int { 4 }

    private let word = Atomic<Int>(0)
    private let box = Atomic<Unmanaged<Box>?>(nil)
    /// The semaphore a waiting close waits on (a fresh one per close).
    private let drained = Mutex<DispatchSemaphore?>(nil)

    init() {}

    var isOpen: Bool { word.load(ordering: .acquiring) & Self.open != 0 }

    /// Opens the view with `value`. Returns the value it replaces, if the view was open
    /// (its box is then left unreleased: operations may be running with it).
    func open(_ value: Value) -> Value? {
        let replaced = box.exchange(Unmanaged.passRetained(Box(value)), ordering: .acquiringAndReleasing)
        word.bitwiseOr(Self.open, ordering: .releasing)
        return replaced?.takeUnretainedValue().value
    }

    /// Counts an operation in and returns the value, or nil (and counts nothing) if the
    /// view is closed. Every non-nil return is matched by one `leave()`.
    func enter() -> Value? {
        // A closed view is refused without touching the count, so that refused
        // operations cannot keep a close from seeing it drain.
        guard isOpen else { return nil }
        let now = word.wrappingAdd(Self.one, ordering: .acquiringAndReleasing).newValue
        guard now & Self.open != 0, let held = box.load(ordering: .acquiring) else {
            leave()
            return nil
        }
        return held.takeUnretainedValue().value
    }

    /// Counts an operation out; the last one out while a close waits wakes it.
    func leave() {
        let now = word.wrappingSubtract(Self.one, ordering: .acquiringAndReleasing).newValue
        if now == Self.waiting { drained.withLock { _ = $0?.signal() } }
    }

    /// Closes the view: no operation enters any more, those in flight have up to
    /// `bound` seconds to leave. Returns the value the view held (nil if it was closed)
    /// and how many operations were still running after the bound.
    func close(waitingAtMost bound: Double) -> (value: Value?, stuck: Int) {
        let semaphore = DispatchSemaphore(value: 0)
        drained.withLock { $0 = semaphore }
        var before = word.load(ordering: .acquiring)
        while true {
            let after = (before & ~Self.open) | (before >= Self.one ? Self.waiting : 0)
            let (exchanged, found) = word.compareExchange(expected: before, desired: after, ordering: .acquiringAndReleasing)
            if exchanged { break }
            before = found
        }
        // Only operations counted before the close can hold the box: those that count
        // themselves in later find the view closed and leave at once. A wake-up is only
        // a hint (a leave of an earlier close may signal late): the count decides.
        let deadline = DispatchTime.now() + bound
        var timedOut = false
        while before >= Self.one && !timedOut && word.load(ordering: .acquiring) >= Self.one {
            timedOut = semaphore.wait(timeout: deadline) == .timedOut
        }
        drained.withLock { $0 = nil }
        let left = word.bitwiseAnd(~Self.waiting, ordering: .acquiringAndReleasing).newValue / Self.one
        let stuck = timedOut ? left : 0
        guard let held = box.exchange(nil, ordering: .acquiringAndReleasing) else { return (nil, stuck) }
        let value = held.takeUnretainedValue().value
        if stuck == 0 { held.release() }
        return (value, stuck)
    }
}
