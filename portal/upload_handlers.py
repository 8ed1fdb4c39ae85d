"""Uploads streamed to anonymous temporary files, with a size cap checked as the bytes arrive.

Django's default handlers keep small files in memory and write larger ones to a named file in
the temporary directory, which a killed server leaves behind. This one writes every file part to
`tempfile.TemporaryFile()`: on Linux it has no name on disk (O_TMPFILE, or unlinked at once), so
the kernel frees it when the process goes, however it goes. The request is refused with
RequestDataTooBig (413) as soon as its declared length, or the bytes received for one file,
pass UPLOAD_MAX_BYTES: nothing past the limit is read or stored.
"""

from __future__ import annotations

import tempfile

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler


class BoundedTemporaryFileUploadHandler(FileUploadHandler):
    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        limit = settings.UPLOAD_MAX_BYTES
        if content_length and content_length > limit:
            raise RequestDataTooBig(
                f"The upload is {content_length:,} bytes; the limit is {limit:,} bytes."
            )
        return None  # go on: the multipart parser calls new_file / receive_data_chunk

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.file = tempfile.TemporaryFile(dir=settings.FILE_UPLOAD_TEMP_DIR)
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > settings.UPLOAD_MAX_BYTES:
            self.file.close()
            raise RequestDataTooBig(
                f"The file {self.file_name!r} is larger than {settings.UPLOAD_MAX_BYTES:,} bytes."
            )
        self.file.write(raw_data)
        return None

    def file_complete(self, file_size):
        self.file.seek(0)
        return UploadedFile(
            file=self.file,
            name=self.file_name,
            content_type=self.content_type,
            size=file_size,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )

    def upload_interrupted(self):
        if hasattr(self, "file"):
            self.file.close()
