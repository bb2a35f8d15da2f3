// SettlementPlan: the names the entries of a directory made on two machines settle to,
// decided from names alone — the same whatever order a directory lists them in.
@testable import CofferVault
import XCTest

final class SettlementPlanTests: XCTestCase {
    private func entry(_ backing: String, _ name: String, alternate: Int = 0) -> SettlementPlan.Entry {
        .init(backing: backing, name: Array(name.utf8), alternate: alternate, settlesAs: Array(name.utf8))
    }

    private func settled(_ entries: [SettlementPlan.Entry], besides own: [String]) -> [String: String] {
        let plan = SettlementPlan.settle(entries, besides: Set(own.map { Array($0.utf8) }))
        return Dictionary(uniqueKeysWithValues: plan.map { ($0.backing, String(decoding: $0.settlesAs, as: UTF8.self)) })
    }

    func testANameFreeUnderTheOwnIVIsKept() {
        XCTAssertEqual(settled([entry("A", "theirs.txt"), entry("B", "sub")], besides: ["mine.txt"]),
                       ["A": "theirs.txt", "B": "sub"])
    }

    func testANameMadeOnBothMachinesTakesTheFirstFreeNumber() {
        XCTAssertEqual(settled([entry("A", "both.txt"), entry("B", "sub")], besides: ["both.txt", "sub", "both (1).txt"]),
                       ["A": "both (2).txt", "B": "sub (1)"])
    }

    func testAnEntryNeverTakesTheNameAnotherKeepsAndTheOrderOfTheListingDoesNotMatter() {
        // The other machine made both "both.txt" and "both (1).txt": the latter keeps its
        // name, the former goes past it — in whichever order they are listed.
        let entries = [entry("A", "both.txt"), entry("B", "both (1).txt"), entry("C", "both.txt", alternate: 1)]
        let expected = ["A": "both (2).txt", "B": "both (1).txt", "C": "both (3).txt"]
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            XCTAssertEqual(settled(order.map { entries[$0] }, besides: ["both.txt"]), expected, "order \(order)")
        }
    }

    func testANameWithNoRoomForTheMarkerKeepsItsOwn() {
        let long = String(repeating: "n", count: 255)
        XCTAssertEqual(settled([entry("A", long)], besides: [long]), ["A": long])
    }
}
