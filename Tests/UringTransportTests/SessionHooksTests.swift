// The session's hooks through libfuse itself, with the test in the kernel's place at the
// other end of a socket pair: each session rewrites its own INIT reply from what its own
// kernel offered, however the two sessions' requests interleave — the hooks find their
// session in libfuse's user data, not in a process-wide variable.
import CFuse
@testable import CofferFUSE
import CofferFileSystem
import CofferVault
import Glibc
import TestSupport
import XCTest

final class SessionHooksTests: XCTestCase {
    static let killPriv = UInt32(FUSE_HANDLE_KILLPRIV_V2)

    /// A libfuse session, not mounted, whose /dev/fuse is `daemonEnd` of a socket pair.
    struct Connection {
        let session: OpaquePointer
        let io: SessionIO
        let kernelEnd: Int32
    }

    var dir: TempDirectory!
    var fs: PlainFileSystem!
    var connections: [Connection] = []

    override func setUpWithError() throws {
        dir = TempDirectory()
        fs = try PlainFileSystem(vault: try Vault.create(at: dir.path, passphrase: secret("p"), kdf: .floor).vault)
    }

    override func tearDown() {
        for connection in connections {
            fuse_session_destroy(connection.session)
            close(connection.kernelEnd)
        }
    }

    func connect() throws -> Connection {
        var ends: [Int32] = [-1, -1]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &ends), 0)
        let io = SessionIO(fs: fs, ringCalls: .kernel, loop: ServingLoop())
        var ops = FuseOperations.table()
        var argv = [strdup("coffer")]
        defer { argv.forEach { free($0) } }
        let session = try XCTUnwrap(argv.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: 1, argv: argv.baseAddress, allocated: 0)
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, Unmanaged.passUnretained(io).toOpaque())
        })
        XCTAssertTrue(io.install(on: session, fd: ends[1], uring: false, settled: { _ in }))
        let connection = Connection(session: session, io: io, kernelEnd: ends[0])
        connections.append(connection)
        return connection
    }

    /// Sends INIT as a kernel of protocol 7.38 does, offering `flags` besides what coffer
    /// requires (O_TRUNC with open).
    func sendInit(_ connection: Connection, unique: UInt64, offering flags: UInt32) {
        var request = [UInt8](repeating: 0, count: MemoryLayout<fuse_in_header>.size + MemoryLayout<fuse_init_in>.size)
        var header = fuse_in_header()
        header.len = UInt32(request.count)
        header.opcode = FUSE_INIT.rawValue
        header.unique = unique
        var offer = fuse_init_in()
        offer.major = 7
        offer.minor = 38
        offer.max_readahead = 1 << 17
        offer.flags = flags | UInt32(FUSE_INIT_EXT) | UInt32(FUSE_ATOMIC_O_TRUNC) | UInt32(FUSE_MAX_PAGES)
        request.withUnsafeMutableBytes {
            $0.storeBytes(of: header, as: fuse_in_header.self)
            $0.storeBytes(of: offer, toByteOffset: MemoryLayout<fuse_in_header>.size, as: fuse_init_in.self)
        }
        XCTAssertEqual(write(connection.kernelEnd, request, request.count), request.count)
    }

    /// Has libfuse read one request through the hook.
    func receive(_ connection: Connection) -> fuse_buf {
        var buffer = fuse_buf()
        XCTAssertGreaterThan(fuse_session_receive_buf(connection.session, &buffer), 0)
        return buffer
    }

    /// Has libfuse process `buffer` and returns the INIT reply the hook sent.
    func process(_ connection: Connection, _ buffer: fuse_buf) -> fuse_init_out? {
        var buffer = buffer
        fuse_session_process_buf(connection.session, &buffer)
        free(buffer.mem)
        var reply = [UInt8](repeating: 0, count: 4096)
        let n = read(connection.kernelEnd, &reply, reply.count)
        guard n >= MemoryLayout<fuse_out_header>.size + MemoryLayout<fuse_init_out>.size else { return nil }
        XCTAssertEqual(reply.withUnsafeBytes { $0.load(as: fuse_out_header.self) }.error, 0)
        return reply.withUnsafeBytes { $0.load(fromByteOffset: MemoryLayout<fuse_out_header>.size, as: fuse_init_out.self) }
    }

    func testEachSessionAnswersItsOwnKernelsInit() throws {
        let offering = try connect(), refusing = try connect()
        // Both kernels number their INIT 2; both requests are read before either reply.
        sendInit(offering, unique: 2, offering: Self.killPriv)
        sendInit(refusing, unique: 2, offering: 0)
        let first = receive(offering), second = receive(refusing)
        let offeringReply = try XCTUnwrap(process(offering, first))
        let refusingReply = try XCTUnwrap(process(refusing, second))
        XCTAssertEqual(offeringReply.flags & Self.killPriv, Self.killPriv, "asked for where offered")
        XCTAssertEqual(refusingReply.flags & Self.killPriv, 0, "never asked for where not offered")
        XCTAssertFalse(offering.io.usesUring || refusing.io.usesUring)
    }
}
