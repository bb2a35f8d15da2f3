// swift-tools-version:6.0
// coffer: an encrypted directory for Linux. The targets follow the layers of the
// product brief; each is testable without the ones above it.
import PackageDescription

/// swift-log: the libraries log through a `Logger`; the executable installs the handler.
let logging: Target.Dependency = .product(name: "Logging", package: "swift-log")

let package = Package(
    name: "coffer",
    products: [
        .executable(name: "coffer", targets: ["coffer"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
    ],
    targets: [
        // Layer 1: C shims, nothing else.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium",
                       providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3",
                       providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd",
                       providers: [.apt(["libsystemd-dev"])]),
        // Intel's ipsec-mb (AES-256-GCM of content blocks on x86-64), loaded with dlopen at
        // run time: coffer builds and runs without it.
        .target(name: "CIPSecMB", linkerSettings: [.linkedLibrary("dl")]),
        // The Linux calls and constants behind _GNU_SOURCE, compiled against the real headers.
        .target(name: "CLinux"),
        // libtss2's ESAPI, loaded with dlopen at first use (its headers at build time,
        // libtss2-dev): coffer runs without libtss2 on machines that have no TPM slots.
        .target(name: "CTPM2"),
        // libsecret (the desktop keyring), loaded with dlopen at first use: no build
        // dependency, and only the command that asks for the keyring loads it (and GLib).
        .target(name: "CKeyring"),
        // Layer 2: the crypto engine — bytes in, bytes out.
        .target(name: "CofferCrypto", dependencies: ["CSodium", "CIPSecMB"]),
        // `coffer speed`: the engine measured against raw libsodium on the same blocks.
        .target(name: "CofferBenchmark", dependencies: ["CofferCrypto", "CofferSystem", "CSodium"]),
        // The OS layer: typed descriptors, errno, retried system calls, locks — no crypto,
        // no format.
        .target(name: "CofferSystem", dependencies: ["CLinux"]),
        // Layer 3: the backing-directory format — config, key slots, headers, blocks,
        // names, the undo journal, fsck.
        .target(name: "CofferVault", dependencies: ["CofferCrypto", "CofferSystem"]),
        // Layer 3½: the plaintext file system — POSIX operations on nodes of a vault,
        // the key gate. FUSE-shaped (node ids, lookup counts) but imports no FUSE.
        .target(name: "CofferFileSystem", dependencies: ["CofferVault", "CofferCrypto", "CofferSystem", logging]),
        // Layer 4, the transport: FUSE over io_uring — the rings that carry the kernel's
        // requests and replies, given libfuse's dispatch and a read to serve; knows no
        // libfuse handler and no file system.
        .target(name: "CofferUring", dependencies: ["CFuse", "CLinux", "CofferSystem", logging]),
        // Layer 4: the FUSE bridge — kernel requests to file-system calls, no crypto.
        .target(name: "CofferFUSE", dependencies: [
            "CFuse", "CofferUring", "CofferFileSystem", "CofferVault", "CofferSystem", logging,
        ]),
        // Layer 5: the gate — locked/unlocked state and the control socket.
        .target(name: "CofferGate", dependencies: [
            "CofferFileSystem", "CofferVault", "CofferCrypto", "CofferSystem", logging,
        ]),
        // Beside layer 5: D-Bus through sd-bus — the mount's object on the session bus and
        // logind's screen lock and suspend on the system bus. The gate never imports it;
        // the command wires the two together.
        .target(name: "CofferBus", dependencies: ["CSystemd", "CofferSystem", logging]),
        // Beside layer 5: a slot key sealed to this machine's TPM (TPM2 key slots). Only
        // the command imports it; the vault and the daemon never load libtss2.
        .target(name: "CofferTPM", dependencies: ["CTPM2", "CofferCrypto"]),
        // Beside layer 5: a slot key kept in the desktop keyring (keyring key slots); as
        // CofferTPM, imported by the command alone.
        .target(name: "CofferKeyring", dependencies: ["CKeyring", "CofferCrypto"]),
        // Layer 6: the command line.
        .executableTarget(name: "coffer", dependencies: [
            "CofferSystem", "CofferCrypto", "CofferVault", "CofferFileSystem", "CofferFUSE", "CofferGate", "CofferBus",
            "CofferTPM", "CofferKeyring", "CofferBenchmark", .product(name: "ArgumentParser", package: "swift-argument-parser"), logging,
        ]),
        // Helpers the tests of several targets share (a temporary directory, secrets).
        .target(name: "TestSupport", dependencies: ["CofferCrypto", "CofferSystem"], path: "Tests/TestSupport"),
        .testTarget(name: "CofferSystemTests", dependencies: ["CofferSystem"]),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto"]),
        .testTarget(name: "CofferVaultTests", dependencies: ["CofferVault", "CofferCrypto", "CofferSystem", "TestSupport"]),
        .testTarget(name: "CofferFileSystemTests", dependencies: [
            "CofferFileSystem", "CofferVault", "CofferCrypto", "CofferSystem", "TestSupport",
        ]),
        .testTarget(name: "CofferFUSETests", dependencies: ["CofferFUSE", "CofferVault", "CofferSystem"]),
        // The io_uring transport (its hand-over, its tickets, its failures) and the
        // session's hooks with a file system, a logger and (where the kernel serves FUSE
        // over io_uring) a real mount, in this process.
        .testTarget(name: "UringTransportTests", dependencies: [
            "CofferUring", "CofferFUSE", "CofferFileSystem", "CofferVault", "CofferCrypto", "CofferSystem", "CLinux", "TestSupport", logging,
        ]),
        .testTarget(name: "CofferGateTests", dependencies: ["CofferGate", "CofferFileSystem", "CofferVault"]),
        // The D-Bus layer without a bus: messages made on a connection nothing answers.
        .testTarget(name: "CofferBusTests", dependencies: ["CofferBus", "CSystemd"]),
        // Drives the built `coffer` binary and real mounts with ordinary tools.
        // The TPM layer against swtpm (a software TPM on loopback, started by each test).
        .testTarget(name: "CofferTPMTests", dependencies: ["CofferTPM", "CofferCrypto", "TestSupport"]),
        // The keyring layer against gnome-keyring-daemon on a private session bus.
        .testTarget(name: "CofferKeyringTests", dependencies: ["CofferKeyring", "CofferCrypto", "TestSupport"]),
        .testTarget(name: "EndToEndTests", dependencies: ["coffer", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
