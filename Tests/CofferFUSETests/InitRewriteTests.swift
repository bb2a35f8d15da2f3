// The rewrite of libfuse's INIT reply, without a kernel: what SessionIO adds to it from
// what the kernel's INIT request offered, and the request it recognises as INIT.
import CFuse
@testable import CofferFUSE
import XCTest

final class InitRewriteTests: XCTestCase {
    static let killPriv = UInt32(FUSE_HANDLE_KILLPRIV_V2), initExt = UInt32(FUSE_INIT_EXT)

    func testKillPrivV2IsAskedForWhereOffered() {
        var reply = fuse_init_out()
        reply.flags = 0x10
        InitReply.rewrite(&reply, offered: InitRequest(unique: 2, offered: Self.killPriv, offered2: 0), uring: false)
        XCTAssertEqual(reply.flags, 0x10 | Self.killPriv)
        XCTAssertEqual(reply.flags2, 0)
        var unoffered = fuse_init_out()
        InitReply.rewrite(&unoffered, offered: InitRequest(unique: 2, offered: 0, offered2: 0), uring: false)
        XCTAssertEqual(unoffered.flags & Self.killPriv, 0, "never asked for where the kernel does not offer it")
    }

    func testIoUringIsAskedForOnlyWithRings() {
        let offered = InitRequest(unique: 2, offered: Self.initExt, offered2: InitReply.overIOUring)
        XCTAssertTrue(InitReply.offersUring(offered))
        XCTAssertFalse(InitReply.offersUring(InitRequest(unique: 2, offered: 0, offered2: InitReply.overIOUring)),
                       "flags2 counts only with FUSE_INIT_EXT")
        XCTAssertFalse(InitReply.offersUring(InitRequest(unique: 2, offered: Self.initExt, offered2: 0)))
        var withRings = fuse_init_out(), withoutRings = fuse_init_out()
        InitReply.rewrite(&withRings, offered: offered, uring: true)
        InitReply.rewrite(&withoutRings, offered: offered, uring: false)
        XCTAssertEqual(withRings.flags & Self.initExt, Self.initExt)
        XCTAssertEqual(withRings.flags2, InitReply.overIOUring)
        XCTAssertEqual(withoutRings.flags2, 0, "no rings made: the kernel must not be told to use them")
    }

    func testOnlyAnInitRequestIsNoted() {
        var bytes = [UInt8](repeating: 0, count: MemoryLayout<fuse_in_header>.size + MemoryLayout<fuse_init_in>.size)
        var header = fuse_in_header()
        header.opcode = FUSE_INIT.rawValue
        header.unique = 2
        var offer = fuse_init_in()
        offer.flags = Self.killPriv | Self.initExt
        offer.flags2 = InitReply.overIOUring
        bytes.withUnsafeMutableBytes {
            $0.storeBytes(of: header, as: fuse_in_header.self)
            $0.storeBytes(of: offer, toByteOffset: MemoryLayout<fuse_in_header>.size, as: fuse_init_in.self)
        }
        XCTAssertEqual(bytes.withUnsafeBytes { InitRequest($0) },
                       InitRequest(unique: 2, offered: Self.killPriv | Self.initExt, offered2: InitReply.overIOUring))
        XCTAssertNil(bytes.withUnsafeBytes { InitRequest(UnsafeRawBufferPointer(rebasing: $0.dropLast())) }, "too short")
        header.opcode = FUSE_LOOKUP.rawValue
        bytes.withUnsafeMutableBytes { $0.storeBytes(of: header, as: fuse_in_header.self) }
        XCTAssertNil(bytes.withUnsafeBytes { InitRequest($0) }, "not INIT")
    }

    func testARingEntryHoldsTheLargestRequestTheKernelMaySend() {
        var reply = fuse_init_out()
        reply.max_write = 1 << 20
        reply.flags = UInt32(FUSE_MAX_PAGES)
        reply.max_pages = 256
        XCTAssertEqual(InitReply.payloadCapacity(for: reply), 1 << 20)
        reply.max_pages = 257
        XCTAssertEqual(InitReply.payloadCapacity(for: reply), 257 * 4096)
        XCTAssertEqual(InitReply.payloadCapacity(for: fuse_init_out()), 32 * 4096, "without FUSE_MAX_PAGES: the kernel's 32")
    }
}
