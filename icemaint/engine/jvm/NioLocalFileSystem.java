package icemaint.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, setting permissions in the JVM instead of by a child process.
 *
 * <p>Without Hadoop's native library (Spark's pip and tarball distributions ship none), RawLocalFileSystem
 * sets the permissions of every file it creates by running {@code chmod} in a child process: a data file,
 * a manifest, a manifest list and a metadata file each cost two (the file and its {@code .crc}), about 4 ms
 * each. This class sets the same mode bits with java.nio; a mode it cannot express that way (sticky,
 * setuid or setgid bits) or a file system without POSIX attributes goes to Hadoop's own code, as before.
 * A rename onto an existing file fails (returns false), as FileSystem's contract says and as the class Spark's
 * distribution registers for {@code file:} (Hive's ProxyLocalFileSystem) does; Hadoop's own LocalFileSystem would
 * replace the file. Everything else is Hadoop's LocalFileSystem (checksums included).
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    if (pathToFile(dst).isFile()) {
      return false;
    }
    return super.rename(src, dst);
  }

  /** The raw (checksum-less) file system under it. */
  public static class Raw extends RawLocalFileSystem {
    // Bit i of a mode (0 = others' execute .. 8 = owner's read).
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ};

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      if ((mode & ~0777) != 0) {
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
      for (int i = 0; i < BITS.length; i++) {
        if ((mode & (1 << i)) != 0) {
          bits.add(BITS[i]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), bits);
      } catch (UnsupportedOperationException e) {
        super.setPermission(p, permission);
      }
    }
  }
}
