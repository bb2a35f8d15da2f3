// WritePlan is what ContentFile decides before a write touches the disk: which blocks
// the write covers, which old blocks it keeps bytes of (read, modified, written back),
// whether an old last block must first grow to a full block, whether a header or an
// empty final block goes with it — and, given the undo journal's state, which old slots
// need undo records and whether those must be durable. Pure: no I/O, unit-tested on its
// own (WritePlanTests); ContentFile carries the plan out.
import CofferCrypto

struct WritePlan: Equatable {
    /// How the header of a file that had none reaches the disk (formats 1–3 only: from
    /// format 4 a file is made with its header).
    enum Header: Equatable {
        /// The file has its header.
        case present
        /// In the same pwrite as the blocks (the write starts at block 0).
        case withBlocks
        /// Written first, on its own.
        case apart
    }

    let offset: Int64
    let end: Int64
    /// The blocks the write covers.
    let first: Int64, last: Int64
    /// The plaintext the sealed blocks hold: from the first block's start to the end of
    /// the write or of the old data in the last block, whichever is later.
    let regionStart: Int64, regionEnd: Int64
    let header: Header
    /// An old last block before the region that is re-sealed as a full block first (it
    /// was partial, or, from format 4, the final block).
    let grown: Int64?
    /// The plaintext size the blocks are written into (after `grown`).
    let plainSize: Int64
    /// The write ends the file at a block boundary: an empty final block follows (format 4).
    let finalAfter: Bool
    /// The first and the last covered block keep old bytes (read-modify-write).
    let keepsFirst: Bool, keepsLast: Bool

    init(offset: Int64, count: Int, plainSize oldSize: Int64, cipherSize: Int64, layout: BlockLayout) {
        let block = BlockLayout.plainBlockSize
        self.offset = offset
        end = offset + Int64(count)
        first = BlockLayout.blockIndex(plainOffset: offset)
        last = BlockLayout.blockIndex(plainOffset: end - 1)
        header = cipherSize != 0 || layout.endsInFinalBlock ? .present : first == 0 ? .withBlocks : .apart
        regionStart = first * block
        regionEnd = max(end, min(oldSize, (last + 1) * block))
        let oldLast = BlockLayout.blockIndex(plainOffset: oldSize)
        grown = (oldSize % block != 0 || layout.endsInFinalBlock) && oldLast < first ? oldLast : nil
        plainSize = grown.map { ($0 + 1) * block } ?? oldSize
        finalAfter = layout.endsInFinalBlock && end > plainSize && end % block == 0
        keepsFirst = offset > regionStart && regionStart < plainSize
        keepsLast = end < regionEnd && !(first == last && keepsFirst)
    }

    /// The caller's bytes are the whole region: they are sealed straight from its buffer.
    var direct: Bool { offset == regionStart && end == regionEnd }

    /// The old slots a rewrite of blocks `blocks` records before it overwrites them, and
    /// how: `kept` are the blocks whose bytes it keeps, `recorded` those with an undo
    /// record already (a rewrite of such a block is always recorded, so that its newest
    /// record describes its last rewrite), `volatile` tells a block written since the
    /// last fsync. Only blocks holding data (below `plainSize`) have a slot to record.
    struct Records: Equatable {
        /// Blocks to record besides the kept ones (their slots are read for it).
        let extra: [Int64]
        /// A recorded block may hold fsynced bytes: the records must reach the disk
        /// before the slots are touched.
        let durable: Bool
        /// Kept blocks that may hold fsynced bytes: they stay non-volatile after the
        /// rewrite, so that their next rewrite is recorded durably too.
        let stayDurable: [Int64]

        init(blocks: ClosedRange<Int64>, plainSize: Int64, kept: [Int64], recorded: [Int64], volatile: (Int64) -> Bool) {
            extra = recorded.filter {
                blocks.contains($0) && $0 * BlockLayout.plainBlockSize < plainSize && !kept.contains($0)
            }.sorted()
            durable = (kept + extra).contains { !volatile($0) }
            stayDurable = kept.filter { !volatile($0) }
        }
    }
}
