// Keyring keeps a slot key in the user's desktop keyring (the Secret Service on the
// session bus) through the CKeyring shim (libsecret, loaded at first use). Only the
// coffer command uses it; the vault and the daemon never do.
import CKeyring
import CofferCrypto

/// Why the keyring could not do what was asked.
public enum KeyringError: Error, Equatable, CustomStringConvertible {
    /// No keyring to ask: libsecret missing, no session bus, no Secret Service on it, or
    /// no default collection.
    case unavailable(String)
    /// The default collection is locked: the desktop session has not unlocked it.
    case locked
    /// No item has the attributes asked for.
    case notFound
    /// Any other failure, with the Secret Service's message.
    case failed(String)

    public var description: String {
        switch self {
        case .unavailable(let why): return "no desktop keyring: \(why)"
        case .locked: return "the desktop keyring is locked (it unlocks with the desktop session's login)"
        case .notFound: return "the keyring holds no such item"
        case .failed(let why): return "the keyring failed: \(why)"
        }
    }
}

/// The keyring items of slot keys: schema io.github.coffer.SlotKey, attributes `vault`
/// (the vault's config checksum: the same on every machine, another for every vault) and
/// `slot` (the slot's id), in the user's default collection.
public enum Keyring {
    /// Stores `key` as the item of (`vault`, `slot`), shown in keyring managers as `label`.
    public static func store(_ key: SecureBytes, vault: String, slot: String, label: String) throws {
        try call { message, capacity in
            key.withUnsafeBytes { bytes in
                coffer_keyring_store(vault, slot, label, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count,
                                     message, capacity)
            }
        }
    }

    /// The secret of the item of (`vault`, `slot`), `size` bytes, in secure memory.
    public static func lookup(vault: String, slot: String, size: Int) throws -> SecureBytes {
        let key = SecureBytes(count: size)
        var length = 0
        do {
            try call { message, capacity in
                key.withUnsafeMutableBytes { bytes in
                    coffer_keyring_lookup(vault, slot, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count,
                                          &length, message, capacity)
                }
            }
        } catch {
            key.wipe()
            throw error
        }
        guard length == size else {
            key.wipe()
            throw KeyringError.failed("the keyring item holds \(length) bytes, not a slot key of \(size)")
        }
        return key
    }

    /// Deletes the item of (`vault`, `slot`); `notFound` if there was none.
    public static func clear(vault: String, slot: String) throws {
        try call { message, capacity in coffer_keyring_clear(vault, slot, message, capacity) }
    }

    /// Runs one shim call with a buffer for its message; its result as an error.
    private static func call(_ body: (UnsafeMutablePointer<CChar>, Int) -> Int32) throws {
        var message = [CChar](repeating: 0, count: 512)
        let result = message.withUnsafeMutableBufferPointer { body($0.baseAddress!, $0.count) }
        let text = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        switch coffer_keyring_result(UInt32(bitPattern: result)) {
        case COFFER_KEYRING_OK: return
        case COFFER_KEYRING_NO_LIBRARY, COFFER_KEYRING_UNAVAILABLE: throw KeyringError.unavailable(text)
        case COFFER_KEYRING_LOCKED: throw KeyringError.locked
        case COFFER_KEYRING_NOT_FOUND: throw KeyringError.notFound
        default: throw KeyringError.failed(text)
        }
    }
}
