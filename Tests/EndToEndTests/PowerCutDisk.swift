// PowerCutDisk is an xfs file system on a loop-mounted image, for cutting the power
// under a vault: `cut()` shuts the file system down without flushing its log and copies
// the image at once; `recover()` mounts the copy (its log replayed) in the same place.
// The loop device and the mount go away at the end of the test, whatever happened.
import Foundation
import XCTest

final class PowerCutDisk {
    let image: String
    let mountpoint: String
    private var device: String?

    /// A fresh xfs of `sizeMiB` (xfs needs 300 MiB at least; the image file is sparse).
    init?(scratch: Scratch, test: XCTestCase, name: String = "disk", sizeMiB: Int = 320) {
        image = scratch.path + "/" + name + ".img"
        mountpoint = scratch.mkdir(name)
        // Runs before the scratch directory's own cleanup (teardown blocks run last first).
        test.addTeardownBlock { [self] in detach() }
        let r = Harness.sh("truncate -s \(sizeMiB)M '\(image)' && mkfs.xfs -q '\(image)'")
        guard r.status == 0 else { XCTFail("mkfs.xfs: \(r.stderr)"); return nil }
        guard attach(image) else { return nil }
    }

    private func attach(_ file: String) -> Bool {
        let r = Harness.sh("losetup -f --show '\(file)'")
        guard r.status == 0 else { XCTFail("losetup: \(r.stderr)"); return false }
        device = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        // nouuid: the copy has the original's UUID, which may still be known.
        let m = Harness.sh("mount -t xfs -o nouuid '\(device!)' '\(mountpoint)'")
        guard m.status == 0 else { XCTFail("mount: \(m.stderr)"); return false }
        return true
    }

    /// Cuts the power: shuts the file system down without writing its log, copies the
    /// image as the disk holds it now, then kills whatever still uses the old file
    /// system (the coffer daemon) and takes it away.
    func cut(_ vault: MountedVault) {
        let r = Harness.sh("xfs_io -x -c shutdown '\(mountpoint)' && cp --sparse=always '\(image)' '\(image).cut'")
        XCTAssertEqual(r.status, 0, "shutdown and copy: \(r.stderr)")
        vault.killDaemon()
        detach()
    }

    /// Mounts the image as it was at the cut, replaying its log as after a reboot.
    @discardableResult
    func recover() -> Bool { attach(image + ".cut") }

    /// Unmounts the file system and detaches the loop device (idempotent).
    func detach() {
        guard let device else { return }
        // The killed processes let go of it within 10 s, even on a loaded machine (fuser
        // fails when it finds none: not the end of the script).
        Harness.sh("fuser -s -k -KILL -m '\(mountpoint)' 2>/dev/null || true; "
                   + "for i in $(seq 100); do umount '\(mountpoint)' 2>/dev/null && exit 0; sleep 0.1; done; "
                   + "umount -l '\(mountpoint)' 2>/dev/null || true")
        Harness.sh("losetup -d '\(device)' 2>/dev/null; true")
        self.device = nil
    }
}
