// SpeedCommand prints the engine's block sealing and opening speed beside raw libsodium's.
import ArgumentParser
import CofferBenchmark
import CofferCrypto
import Foundation

struct SpeedCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "speed",
        abstract: "Measure the crypto engine on 4 KiB blocks against raw libsodium (one core), "
            + "for each content cipher and, for AES-256-GCM, each library that runs it.")

    @Option(help: "Seconds to spend on each measurement.")
    var seconds: Double = 1.0

    func validate() throws {
        guard seconds > 0 && seconds <= 60 else { throw ValidationError("--seconds must be between 0 and 60") }
    }

    func run() throws {
        func row(_ name: String, _ engine: Double, _ raw: Double) -> String {
            name.padding(toLength: 28, withPad: " ", startingAt: 0)
                + String(format: "%9.0f MB/s %9.0f MB/s   %.2f", engine, raw, engine / raw)
        }
        print("4 KiB blocks                         engine   raw libsodium   engine/raw")
        for algorithm in ContentAlgorithm.allCases {
            let name = algorithm.rawValue + (algorithm == .preferred ? " (default here)" : "")
            guard algorithm.isAvailable else {
                print("\(name): not available on this CPU (needs AES-NI and PCLMUL)")
                continue
            }
            guard algorithm == .aes256gcm else {
                let r = EngineBenchmark.run(algorithm: algorithm, seconds: seconds)
                print(name)
                print(row("  seal (random nonce)", r.engineSeal, r.rawSeal))
                print(row("  open", r.engineOpen, r.rawOpen))
                continue
            }
            let chosen = AESEngine.chosen
            print(name + ": a mount uses \(chosen.engine.rawValue): \(chosen.reason)")
            for engine in AESEngine.allCases {
                if let why = engine.unavailableReason {
                    print("  by \(engine.rawValue): not available (\(why))")
                    continue
                }
                let r = EngineBenchmark.run(algorithm: algorithm, engine: engine, seconds: seconds)
                print("  by \(engine.detail)")
                print(row("    seal (random nonce)", r.engineSeal, r.rawSeal))
                print(row("    open", r.engineOpen, r.rawOpen))
            }
        }
    }
}
