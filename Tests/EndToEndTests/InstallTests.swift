// End-to-end: scripts/install into a scratch prefix — the binary, the mount.coffer link
// that mount(8) runs, the units, completions that bash loads, a man page that man finds
// and that names every option — and --uninstall, which leaves nothing behind.
import Foundation
import XCTest

final class InstallTests: EndToEndCase {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    /// What `scripts/install --prefix` puts under the prefix.
    static let installed = ["bin/coffer", "sbin/mount.coffer", "lib/systemd/system/coffer@.service",
                            "lib/systemd/user/coffer@.service", "share/man/man1/coffer.1",
                            "share/bash-completion/completions/coffer", "share/zsh/site-functions/_coffer",
                            "share/fish/vendor_completions.d/coffer.fish"]

    func install(_ arguments: [String]) -> Outcome {
        Harness.run([Self.root + "/scripts/install"] + arguments)
    }

    func testInstallIntoAPrefixThenMountThenUninstall() throws {
        let prefix = scratch.path + "/prefix"
        assertOK(install(["--prefix", prefix, "--binary", Harness.coffer]), "install")
        let fm = FileManager.default
        for file in Self.installed {
            XCTAssertTrue(fm.fileExists(atPath: prefix + "/" + file), "\(file) not installed")
        }
        XCTAssertEqual(try? fm.destinationOfSymbolicLink(atPath: prefix + "/sbin/mount.coffer"), prefix + "/bin/coffer")
        let unit = (try? String(contentsOfFile: prefix + "/lib/systemd/system/coffer@.service", encoding: .utf8)) ?? ""
        XCTAssertTrue(unit.contains("ExecStart=\(prefix)/bin/coffer mount --foreground"), unit)
        XCTAssertFalse(unit.contains("/usr/local/bin"), "the units name the installed binary")

        // man finds the page, and it renders.
        XCTAssertEqual(Harness.sh("MANPATH=\(prefix)/share/man man -w coffer").stdout, "\(prefix)/share/man/man1/coffer.1\n")
        let page = Harness.sh("LC_ALL=C MANPAGER=cat MANWIDTH=120 man -l \(prefix)/share/man/man1/coffer.1 2>/dev/null")
        for word in ["unlock", "passwd", "--extpass", "--idle-lock"] {
            XCTAssertTrue(page.stdout.contains(word), "the man page lacks \(word)")
        }
        // bash completes subcommands and options with the installed script.
        let bash = Harness.sh("""
            set +eu   # as in an interactive shell
            source \(prefix)/share/bash-completion/completions/coffer
            fn=$(complete -p coffer | sed -E 's/.*-F ([^ ]+).*/\\1/')
            COMP_WORDS=(coffer un); COMP_CWORD=1; COMP_LINE='coffer un'; COMP_POINT=9
            "$fn" coffer un coffer; printf '%s\\n' "${COMPREPLY[@]}"
            COMPREPLY=(); COMP_WORDS=(coffer mount --ext); COMP_CWORD=2; COMP_LINE='coffer mount --ext'; COMP_POINT=18
            "$fn" coffer --ext mount; printf '%s\\n' "${COMPREPLY[@]}"
            """)
        let words = Set(bash.stdout.split(separator: "\n").map(String.init))
        XCTAssertTrue(words.isSuperset(of: ["unlock", "unmount", "--extpass"]), bash.stdout + bash.stderr)
        XCTAssertTrue(try String(contentsOfFile: prefix + "/share/zsh/site-functions/_coffer", encoding: .utf8).hasPrefix("#compdef coffer"))
        XCTAssertTrue(try String(contentsOfFile: prefix + "/share/fish/vendor_completions.d/coffer.fish", encoding: .utf8).contains("complete -c 'coffer'"))

        // mount(8) and umount(8) through the installed helper.
        try linkMountHelper(to: prefix + "/sbin/mount.coffer", for: self)
        let vault = MountedVault(scratch: scratch)
        assertOK(Harness.run(["mount", "-t", "coffer", vault.cipherdir, vault.mountpoint, "-o", "passfile=\(vault.passfile)"]),
                 "mount -t coffer with the installed helper")
        assertOK(vault.sh("echo installed > f && cat f"), "use the mount")
        assertOK(Harness.run(["umount", vault.mountpoint]), "umount")
        XCTAssertFalse(vault.isMounted)

        assertOK(install(["--prefix", prefix, "--uninstall"]), "uninstall")
        let left = Harness.sh("find \(prefix) ! -type d").stdout
        XCTAssertEqual(left, "", "left behind by --uninstall")
    }

    /// The checked-in man page is generated from the command definitions: every command
    /// and option that --help shows is in it.
    func testManPageNamesEveryCommandAndOption() throws {
        let page = try String(contentsOfFile: Self.root + "/docs/coffer.1", encoding: .utf8)
        let dump = Harness.run([Harness.coffer, "--experimental-dump-help"])
        let json = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        func check(_ command: [String: Any]) {
            guard command["shouldDisplay"] as? Bool ?? true else { return }
            let name = command["commandName"] as? String ?? "?"
            if command["superCommands"] != nil {
                XCTAssertTrue(page.contains(".It Em \(name)\n"), "coffer.1 lacks the command \(name): regenerate it (README, Install)")
            }
            for argument in command["arguments"] as? [[String: Any]] ?? [] {
                guard argument["shouldDisplay"] as? Bool ?? true else { continue }
                for case let names as [String: Any] in argument["names"] as? [Any] ?? [] where names["kind"] as? String == "long" {
                    // mdoc writes --passfile as `Fl -passfile`, and -R/--recursive as `Fl R , -recursive`.
                    let long = names["name"] as? String ?? ""
                    let option = "Fl -" + long
                    XCTAssertTrue(page.contains(option) || page.range(of: "Fl [A-Za-z] , -\(long)\n", options: .regularExpression) != nil,
                                  "coffer.1 lacks \(name) \(option): regenerate it (README, Install)")
                }
            }
            for sub in command["subcommands"] as? [[String: Any]] ?? [] { check(sub) }
        }
        check(try XCTUnwrap(json["command"] as? [String: Any]))
    }
}
