package bench

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

// broker starts mosquitto on a free port: mochi-mqtt v2.7.9 deadlocks on
// its in-flight lock when a publisher outruns a subscriber at full speed,
// so the throughput figures need a broker that survives overload. DESIGN's
// settings for comparisons apply (in-flight and queue limits raised,
// TCP_NODELAY).
func broker(b *testing.B) string {
	url, _ := mosquitto(b, "")
	return url
}

// mosquittoExe finds the mosquitto binary; a benchmark without it skips.
func mosquittoExe(b *testing.B) string {
	exe, err := exec.LookPath("mosquitto")
	if err != nil {
		exe = "/usr/sbin/mosquitto"
		if _, err := os.Stat(exe); err != nil {
			b.Skip("mosquitto is not installed (apt-get install -y mosquitto)")
		}
	}
	return exe
}

// mosquitto starts a mosquitto broker with the comparison settings plus
// extra configuration lines (a bridge connection, say) and returns its URL
// and process id (for its CPU time).
func mosquitto(b *testing.B, extra string) (url string, pid int) {
	b.Helper()
	exe := mosquittoExe(b)
	addr, err := embroker.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	dir := b.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`per_listener_settings false
allow_anonymous true
persistence false
max_inflight_messages 1000
max_queued_messages 1000000
set_tcp_nodelay true
log_dest none
listener %s 127.0.0.1
%s`, port, extra)), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-c", conf)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if i > 200 {
			b.Fatal("mosquitto did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "tcp://" + addr, cmd.Process.Pid
}

// mosquittoBridge is broker B's configuration for mosquitto's own bridge
// from broker a: "in/#" there arrives as "out/#" here, QoS 1, the
// equivalent of the bridge's benchmark route. The bridge's in-flight
// window comes from broker a's max_inflight_messages (1000).
func mosquittoBridge(a string) string {
	return fmt.Sprintf(`connection bench
address %s
cleansession true
notifications false
topic # in 1 out/ in/
`, a[len("tcp://"):])
}
