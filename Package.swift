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
        // The Linux calls and constants behind _GNU_SOURCE, compiled against the real headers.
        .target(name: "CLinux"),
        // Layer 2: the crypto engine — bytes in, bytes out.
        .target(name: "CofferCrypto", dependencies: ["CSodium"]),
        // Layer 3: the backing-directory format.
        .target(name: "CofferVault", dependencies: ["CofferCrypto", "CLinux", logging]),
        // Layer 4: the FUSE bridge — kernel requests to vault calls, no crypto.
        .target(name: "CofferFUSE", dependencies: ["CFuse", "CofferVault", logging]),
        // Layer 5: the gate — locked/unlocked state and the control socket.
        .target(name: "CofferGate", dependencies: ["CofferVault", "CofferCrypto", "CLinux", logging]),
        // Layer 6: the command line.
        .executableTarget(name: "coffer", dependencies: [
            "CLinux", "CofferCrypto", "CofferVault", "CofferFUSE", "CofferGate",
            .product(name: "ArgumentParser", package: "swift-argument-parser"), logging,
        ]),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto"]),
        .testTarget(name: "CofferVaultTests", dependencies: ["CofferVault", "CofferCrypto"]),
        .testTarget(name: "CofferFUSETests", dependencies: ["CofferFUSE", "CofferVault"]),
        .testTarget(name: "CofferGateTests", dependencies: ["CofferGate"]),
        // Drives the built `coffer` binary and real mounts with ordinary tools.
        .testTarget(name: "EndToEndTests", dependencies: ["coffer"]),
    ],
    swiftLanguageModes: [.v6]
)
