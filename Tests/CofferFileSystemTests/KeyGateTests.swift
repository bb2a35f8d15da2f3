// Tests of KeyGate, the atomic hold on the keys: the value only while open, a close that
// waits for the operations in flight (and no longer than its bound), and, under threads
// entering and leaving all the time, no operation still inside once a close returns.
@testable import CofferFileSystem
import Dispatch
import Foundation
import Synchronization
import XCTest

final class KeyGateTests: XCTestCase {
    func testEnterGetsTheValueOnlyWhileOpen() {
        let gate = KeyGate<Int>()
        XCTAssertNil(gate.enter())
        XCTAssertNil(gate.open(1))
        XCTAssertTrue(gate.isOpen)
        XCTAssertEqual(gate.enter(), 1)
        gate.leave()
        XCTAssertEqual(gate.open(2), 1, "a second open replaces the value and returns the first")
        let (value, stuck) = gate.close(waitingAtMost: 1)
        XCTAssertEqual(value, 2)
        XCTAssertEqual(stuck, 0)
        XCTAssertFalse(gate.isOpen)
        XCTAssertNil(gate.enter())
        XCTAssertNil(gate.close(waitingAtMost: 1).value, "closing a closed gate gives nothing")
    }

    func testCloseWaitsForTheOperationInFlight() {
        let gate = KeyGate<Int>()
        _ = gate.open(7)
        let entered = DispatchSemaphore(value: 0), go = DispatchSemaphore(value: 0), closed = DispatchSemaphore(value: 0)
        let result = Mutex<(Int?, Int)?>(nil)
        Thread.detachNewThread {
            XCTAssertEqual(gate.enter(), 7)
            entered.signal()
            go.wait()
            gate.leave()
        }
        entered.wait()
        Thread.detachNewThread {
            let closing = gate.close(waitingAtMost: 30)
            result.withLock { $0 = closing }
            closed.signal()
        }
        XCTAssertEqual(closed.wait(timeout: .now() + 0.3), .timedOut, "the close waits while the operation runs")
        XCTAssertNil(gate.enter(), "nothing enters once the close began")
        go.signal()
        XCTAssertEqual(closed.wait(timeout: .now() + 30), .success)
        let (value, stuck) = result.withLock { $0 }!
        XCTAssertEqual(value, 7)
        XCTAssertEqual(stuck, 0)
    }

    func testCloseStopsWaitingAfterItsBoundAndCountsTheStuck() {
        let gate = KeyGate<Int>()
        _ = gate.open(3)
        XCTAssertEqual(gate.enter(), 3)
        let (value, stuck) = gate.close(waitingAtMost: 0.05)
        XCTAssertEqual(value, 3, "the value is handed over to be wiped all the same")
        XCTAssertEqual(stuck, 1)
        gate.leave()
        XCTAssertNil(gate.open(4), "the box left to the stuck operation is not handed out again")
        XCTAssertEqual(gate.enter(), 4)
        gate.leave()
    }

    /// Threads enter and leave without pause while the gate is closed and opened again:
    /// every close that reports nothing stuck finds no operation inside.
    func testNoOperationIsInsideWhenACloseReturns() {
        let gate = KeyGate<Int>()
        _ = gate.open(0)
        let inside = Atomic<Int>(0), stop = Atomic<Bool>(false)
        let done = DispatchSemaphore(value: 0)
        for _ in 0..<4 {
            Thread.detachNewThread {
                while !stop.load(ordering: .relaxed) {
                    guard gate.enter() != nil else { continue }
                    inside.wrappingAdd(1, ordering: .sequentiallyConsistent)
                    inside.wrappingSubtract(1, ordering: .sequentiallyConsistent)
                    gate.leave()
                }
                done.signal()
            }
        }
        for round in 1...2000 {
            let (value, stuck) = gate.close(waitingAtMost: 10)
            XCTAssertEqual(stuck, 0)
            XCTAssertEqual(inside.load(ordering: .sequentiallyConsistent), 0, "an operation inside after close \(round)")
            XCTAssertEqual(value, round - 1)
            _ = gate.open(round)
        }
        stop.store(true, ordering: .relaxed)
        for _ in 0..<4 { done.wait() }
    }
}
