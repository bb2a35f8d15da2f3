// PerThread gives each thread an object of its own (a nonce pool, an ipsec-mb context),
// made at the thread's first use and released when the thread ends (a pthread key).
import Glibc

final class PerThread<Value: AnyObject>: @unchecked Sendable {
    // Unchecked: `key` never changes after init, `make` is Sendable, and each thread
    // reads and writes only its own slot of the key.
    private let key: pthread_key_t
    private let make: @Sendable () -> Value

    init(_ make: @escaping @Sendable () -> Value) {
        var key = pthread_key_t()
        pthread_key_create(&key) { object in
            if let object { Unmanaged<AnyObject>.fromOpaque(object).release() }
        }
        self.key = key
        self.make = make
    }

    /// The calling thread's object.
    var current: Value {
        if let existing = pthread_getspecific(key) { return Unmanaged<Value>.fromOpaque(existing).takeUnretainedValue() }
        let object = make()
        pthread_setspecific(key, Unmanaged.passRetained(object).toOpaque())
        return object
    }
}
