// VolatileBlocks remembers which blocks of one backing inode hold no byte an fsync may
// have made durable: every byte in them was written since the inode's last fsync in this
// daemon, so rewriting them needs no durable undo record (UndoJournal). Anything it does
// not know is durable.
import Synchronization

public final class VolatileBlocks: Sendable {
    /// Disjoint, sorted, inclusive block ranges. Past `maxRanges` the lowest range is
    /// forgotten, which only makes its blocks count as durable again (safe, dearer).
    private let ranges = Mutex<[ClosedRange<Int64>]>([])
    private static let maxRanges = 64
    public init() {}

    public func contains(_ block: Int64) -> Bool {
        ranges.withLock { $0.contains { $0.contains(block) } }
    }

    /// Blocks `range` were written and not synced.
    public func insert(_ range: ClosedRange<Int64>) {
        ranges.withLock { ranges in
            var merged = range
            ranges.removeAll { other in
                guard other.lowerBound <= merged.upperBound + 1 && merged.lowerBound <= other.upperBound + 1 else { return false }
                merged = min(merged.lowerBound, other.lowerBound)...max(merged.upperBound, other.upperBound)
                return true
            }
            let at = ranges.firstIndex { $0.lowerBound > merged.upperBound } ?? ranges.endIndex
            ranges.insert(merged, at: at)
            if ranges.count > Self.maxRanges { ranges.removeFirst() }
        }
    }

    /// Blocks `range` reached the disk (a synchronous write).
    public func remove(_ range: ClosedRange<Int64>) {
        ranges.withLock { ranges in
            ranges = ranges.flatMap { other -> [ClosedRange<Int64>] in
                guard other.overlaps(range) else { return [other] }
                var rest: [ClosedRange<Int64>] = []
                if other.lowerBound < range.lowerBound { rest.append(other.lowerBound...range.lowerBound - 1) }
                if other.upperBound > range.upperBound { rest.append(range.upperBound + 1...other.upperBound) }
                return rest
            }
        }
    }

    /// The file was fsynced: every block is durable.
    public func removeAll() { ranges.withLock { $0.removeAll() } }
}
