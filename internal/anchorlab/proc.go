package anchorlab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/lease/etcdtest"
)

// proc is a subprocess of the lab (a candidate or the namespaced etcd).
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
}

func startCmd(exe string, wrap []string, envVar string, spec any, logw io.Writer, stdout io.Writer) (*proc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	argv := append(append([]string{}, wrap...), exe)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), envVar+"="+string(b))
	cmd.Stderr = logw
	cmd.Stdout = stdout
	// Its own process group: a signal to the lab's group (Ctrl-C) does
	// not reach the candidates; the lab ends them, and the kernel does
	// when the lab dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// startProc starts a candidate, prefixed by wrap (ip netns exec ns).
func startProc(exe string, wrap []string, spec CandidateSpec, logw io.Writer) (*proc, error) {
	return startCmd(exe, wrap, envCandidate, spec, logw, nil)
}

// signal signals the candidate (`ip netns exec` execs the program, so the
// pid is the candidate's also in a namespace).
func (p *proc) signal(s syscall.Signal) error { return p.cmd.Process.Signal(s) }

// kill ends the process (SIGCONT after SIGKILL, in case it is stopped)
// and waits for it.
func (p *proc) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		<-p.exited
	})
}

// envEtcd carries the etcdSpec of the namespaced etcd subprocess.
const envEtcd = "MYRIARCH_ANCHORLAB_ETCD"

type etcdSpec struct {
	Dir    string `json:"dir"`
	Listen string `json:"listen"`
}

// startEtcdProc starts an embedded etcd (lease/etcdtest) in a subprocess
// wrapped by wrap, reachable on listen, and waits until it serves.
func startEtcdProc(ctx context.Context, exe string, wrap []string, dir, listen string, logw io.Writer) (*proc, error) {
	pr, pw := io.Pipe()
	p, err := startCmd(exe, wrap, envEtcd, etcdSpec{Dir: dir, Listen: listen}, logw, pw)
	if err != nil {
		return nil, err
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case ready <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		<-p.exited
		pw.Close()
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			p.kill()
			return nil, fmt.Errorf("anchorlab: etcd subprocess: %s", line)
		}
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("anchorlab: the etcd subprocess exited before it served")
	case <-time.After(60 * time.Second):
		p.kill()
		return nil, fmt.Errorf("anchorlab: the etcd subprocess did not serve within 60s")
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
}

// maybeRunEtcd runs the namespaced etcd subprocess: an embedded etcd on
// loopback and a TCP forwarder from listen to it, until SIGTERM or SIGKILL.
func maybeRunEtcd() {
	v := os.Getenv(envEtcd)
	if v == "" {
		return
	}
	var spec etcdSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Println("bad spec:", err)
		os.Exit(2)
	}
	srv, err := etcdtest.StartIn(spec.Dir, "anchorlab")
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(1)
	}
	defer srv.Stop()
	ln, err := net.Listen("tcp", spec.Listen)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	target := strings.TrimPrefix(srv.Endpoint, "http://")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go forward(c, target)
		}
	}()
	fmt.Println("ready")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	<-ctx.Done()
	stop()
	ln.Close()
	srv.Stop()
	os.Exit(0)
}

func forward(c net.Conn, target string) {
	defer c.Close()
	u, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
}
