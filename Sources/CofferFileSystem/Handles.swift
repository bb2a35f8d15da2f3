// Handles turns an object into the 64-bit handle the kernel passes back with each
// request (its retained address) and back, for open files and open directories.
enum Handles {
    /// Retains `object` until `release`; its address is the handle.
    static func make(_ object: AnyObject) -> UInt64 {
        UInt64(UInt(bitPattern: Unmanaged.passRetained(object).toOpaque()))
    }

    /// The object behind a live handle.
    static func borrow<T: AnyObject>(_ handle: UInt64, as type: T.Type) -> T {
        Unmanaged<T>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(handle))!).takeUnretainedValue()
    }

    /// Ends a handle: the object goes once nothing else holds it.
    static func release<T: AnyObject>(_ handle: UInt64, as type: T.Type) {
        Unmanaged<T>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(handle))!).release()
    }
}
